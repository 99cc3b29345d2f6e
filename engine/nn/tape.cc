#include "engine/nn/tape.h"

#include <algorithm>

#include "common/status_macros.h"

namespace troupe::nn {
namespace {
// The arena's first block; each later one twice the one before (or what one
// value needs): a step's arena ends within about twice what it uses, on a
// device whose memory is counted (nn::Backend's budget) as on any other.
constexpr int64_t kFirstBlockBytes = int64_t{1} << 20;
constexpr int64_t kAlignBytes = 64;
// The bytes an allocation of `bytes` takes in the arena (the next one starts there).
int64_t ArenaBytes(int64_t bytes) { return (std::max<int64_t>(1, bytes) + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }
}  // namespace

Tape::Tape(Backend* backend) : backend_(backend) {
  values_.reserve(256);
  nodes_.reserve(256);
}

Tape::~Tape() {
  for (Block& b : blocks_) backend_->Free(b.data);
}

void* Tape::AllocateBytes(int64_t bytes) {
  bytes = ArenaBytes(bytes);
  // Use the current block if it fits, else the next one that fits, else a new one.
  while (current_block_ < static_cast<int>(blocks_.size())) {
    Block& b = blocks_[current_block_];
    if (block_used_ + bytes <= b.capacity) {
      void* p = b.data + block_used_;
      block_used_ += bytes;
      return p;
    }
    ++current_block_;
    block_used_ = 0;
  }
  const int64_t capacity = std::max(blocks_.empty() ? kFirstBlockBytes : 2 * blocks_.back().capacity, bytes);
  char* data = static_cast<char*>(backend_->AllocateScratch(capacity));
  blocks_.push_back({data, capacity});
  current_block_ = static_cast<int>(blocks_.size()) - 1;
  block_used_ = bytes;
  return data;
}

float* Tape::AllocateFloats(int64_t count) {
  return static_cast<float*>(AllocateBytes(std::max<int64_t>(1, count) * sizeof(float)));
}

int32_t* Tape::AllocateInts(int64_t count) {
  return static_cast<int32_t*>(AllocateBytes(std::max<int64_t>(1, count) * sizeof(int32_t)));
}

int32_t* Tape::HostInts(int64_t count) {
  if (static_cast<int64_t>(host_ints_.size()) < count) host_ints_.resize(count);
  return host_ints_.data();
}

int64_t Tape::arena_bytes() const {
  int64_t total = 0;
  for (const Block& b : blocks_) total += b.capacity;
  return total;
}

Var Tape::Parameter(ParameterSet& set, int index) {
  TROUPE_CHECK(set.allocated());
  Value v;
  v.data = set.value(index).data;
  v.grad = set.grad(index).data;
  v.shape = set.info(index).shape;
  v.requires_grad = true;
  v.external_grad = true;
  v.param_set = &set;
  v.param_index = index;
  values_.push_back(v);
  return {this, static_cast<int>(values_.size()) - 1};
}

Var Tape::Input(const float* host, Shape shape) {
  float* data = AllocateFloats(shape.size());
  backend_->Upload(host, data, sizeof(float) * shape.size());
  return Constant(data, shape);
}

const uint8_t* Tape::InputBytes(const void* host, int64_t bytes) {
  auto* data = static_cast<uint8_t*>(AllocateBytes(std::max<int64_t>(1, bytes)));
  backend_->Upload(host, data, bytes);
  return data;
}

Var Tape::Constant(const float* data, Shape shape) {
  Value v;
  v.data = const_cast<float*>(data);
  v.shape = shape;
  values_.push_back(v);
  return {this, static_cast<int>(values_.size()) - 1};
}

Var Tape::Leaf(const float* data, Shape shape) {
  Var v = Constant(data, shape);
  values_[v.id].requires_grad = true;
  return v;
}

Var Tape::NewValue(Shape shape, bool requires_grad) {
  Value v;
  v.data = AllocateFloats(shape.size());
  v.shape = shape;
  v.requires_grad = requires_grad;
  values_.push_back(v);
  return {this, static_cast<int>(values_.size()) - 1};
}

Var Tape::Alias(Var of, Shape shape) {
  TROUPE_CHECK(shape.size() == values_[of.id].shape.size());
  Value v = values_[of.id];
  v.shape = shape;
  // An alias shares the gradient buffer; it is resolved in Backward.
  v.external_grad = false;
  v.param_set = nullptr;
  v.param_index = -1;
  v.alias_of = values_[of.id].alias_of >= 0 ? values_[of.id].alias_of : of.id;
  values_.push_back(v);
  const int id = static_cast<int>(values_.size()) - 1;
  // Record the alias so Backward can point its gradient at the original's.
  Node node;
  node.out = id;
  node.in[0] = of.id;
  node.backward = nullptr;  // no work: gradients are shared
  if (v.requires_grad) nodes_.push_back(node);
  return {this, id};
}

void Tape::Record(const Node& node) {
  if (values_[node.out].requires_grad) nodes_.push_back(node);
}

void Tape::Backward(Var loss, GradientListener* listener) {
  TROUPE_CHECK(values_[loss.id].shape.size() == 1);
  if (!values_[loss.id].requires_grad) return;  // a loss of constants: nothing to differentiate
  const int num_values = static_cast<int>(values_.size());
  // Gradient buffers for intermediates, zeroed; aliases share their source's.
  // Buffers allocated one after another lie end to end in the arena (their
  // padding included), so each such run is zeroed by one Fill: one kernel
  // launch where a GPU backend made one per value (dozens a step).
  float* run = nullptr;
  int64_t run_floats = 0;
  const auto zero_run = [&] {
    if (run_floats > 0) backend_->Fill(run, run_floats, 0.0f);
    run_floats = 0;
  };
  for (int id = 0; id < num_values; ++id) {
    Value& v = values_[id];
    if (!v.requires_grad) continue;
    if (v.alias_of >= 0) {
      v.grad = values_[v.alias_of].grad;  // sources come first
    } else if (!v.external_grad && v.grad == nullptr) {
      v.grad = AllocateFloats(v.shape.size());
      const int64_t floats = ArenaBytes(v.shape.size() * sizeof(float)) / sizeof(float);  // with its padding
      if (run_floats > 0 && v.grad == run + run_floats) {
        run_floats += floats;
      } else {
        zero_run();
        run = v.grad;
        run_floats = floats;
      }
    }
  }
  zero_run();
  // For the listener: each parameter value's earliest using node.
  if (listener != nullptr) {
    last_use_.assign(num_values, -1);
    for (int k = static_cast<int>(nodes_.size()) - 1; k >= 0; --k) {
      for (int in : nodes_[k].in) {
        if (in >= 0) last_use_[in] = k;
      }
    }
  }
  // d(loss)/d(loss) = 1, added on the device (the loss may be a parameter's leaf).
  float* one = AllocateFloats(1);
  backend_->Fill(one, 1, 1.0f);
  backend_->Axpy(1.0f, one, values_[loss.id].grad, 1);
  for (int k = static_cast<int>(nodes_.size()) - 1; k >= 0; --k) {
    const Node& node = nodes_[k];
    if (node.backward != nullptr) node.backward(*this, node);
    if (listener == nullptr) continue;
    for (int in : node.in) {
      if (in >= 0 && last_use_[in] == k && values_[in].param_set != nullptr) {
        listener->OnGradientReady(*values_[in].param_set, values_[in].param_index);
      }
    }
    if (listener->StopBackward()) return;
  }
}

float Tape::item(Var v) {
  float x = 0;
  backend_->Download(values_[v.id].data, &x, sizeof(float));
  return x;
}

void Tape::Reset() {
  values_.clear();
  nodes_.clear();
  current_block_ = 0;
  block_used_ = 0;
}

}  // namespace troupe::nn
