// Reverse-mode automatic differentiation: a tape of nodes. Forward ops
// (ops.h) compute their output at once through the Backend and append a node
// holding a backward function pointer and its small parameters; Backward()
// walks the nodes in reverse, accumulating gradients.
//
// Memory: every intermediate value, gradient and saved buffer comes from the
// tape's arena, a list of blocks allocated by the backend (its device's
// memory, backend.h: scratch, dead after each training step) that Reset()
// rewinds without freeing. A
// training step that records the same ops each time allocates nothing after
// its first step (the node and value vectors keep their capacity too).
//
// Not thread-safe; one tape per replica and thread.
#ifndef TROUPE_ENGINE_NN_TAPE_H_
#define TROUPE_ENGINE_NN_TAPE_H_

#include <array>
#include <cstdint>
#include <vector>

#include "engine/nn/backend.h"
#include "engine/nn/parameters.h"
#include "engine/nn/tensor.h"

namespace troupe::nn {

class Tape;

// A handle to a value recorded on a tape (valid until the tape's Reset()).
struct Var {
  Tape* tape = nullptr;
  int id = -1;
  bool valid() const { return tape != nullptr; }
};

// A value on the tape: its data, its gradient (null until needed), its shape.
struct Value {
  float* data = nullptr;
  float* grad = nullptr;
  Shape shape;
  bool requires_grad = false;
  bool external_grad = false;  // grad points into a ParameterSet
  const ParameterSet* param_set = nullptr;
  int param_index = -1;
  int alias_of = -1;  // a reshape shares this value's data and gradient
};

struct Node;
using BackwardFn = void (*)(Tape& tape, const Node& node);

// One recorded op. Small fixed fields instead of closures, so recording a node
// never allocates.
struct Node {
  BackwardFn backward = nullptr;
  int out = -1;
  std::array<int, 4> in{-1, -1, -1, -1};
  std::array<int64_t, 12> i{};
  std::array<float, 4> f{};
  std::array<float*, 3> saved{};
  const void* ptr = nullptr;  // op-specific (labels, shifts, reducer)
  void* mutable_ptr = nullptr;
};

// Told when a parameter's gradient is final during Backward(), so its
// all-reduce can start while earlier layers are still differentiated.
class GradientListener {
 public:
  virtual ~GradientListener() = default;
  virtual void OnGradientReady(const ParameterSet& set, int param_index) = 0;
  // Asked after each node: true stops Backward there, the rest of the
  // gradients left as they are (a replica past its step's deadline:
  // replicator::DeadlineReducer).
  virtual bool StopBackward() { return false; }
};

class Tape {
 public:
  explicit Tape(Backend* backend);
  ~Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  Backend& backend() { return *backend_; }

  // Leaves. A parameter's gradient accumulates into its set's grad buffer.
  Var Parameter(ParameterSet& set, int index);
  // An input from the host (a batch, a target): uploaded into the arena, a
  // constant (no gradient) of the step.
  Var Input(const float* host, Shape shape);
  // `bytes` of host data uploaded into the arena (uint8 pixels for
  // ImagesToFloat); valid until Reset().
  const uint8_t* InputBytes(const void* host, int64_t bytes);
  // A constant (no gradient) on data already in the backend's memory (a
  // value of this or another tape, a parameter used as a constant): the data
  // is referenced, not copied; it must outlive the step.
  Var Constant(const float* device_data, Shape shape);
  // A leaf whose gradient is wanted (tests, inputs to differentiate), on
  // device data as Constant.
  Var Leaf(const float* device_data, Shape shape);

  // Records an op's output: a new value of `shape` with data from the arena.
  Var NewValue(Shape shape, bool requires_grad);
  // A value sharing another's data and gradient (reshape).
  Var Alias(Var of, Shape shape);
  // Appends a node (only if its output requires grad).
  void Record(const Node& node);

  Value& value(Var v) { return values_[v.id]; }
  Value& value(int id) { return values_[id]; }
  TensorView data(Var v) { return {values_[v.id].data, values_[v.id].shape}; }
  // The gradient of `v` after Backward (null if it does not require grad).
  TensorView grad(Var v) { return {values_[v.id].grad, values_[v.id].shape}; }
  // Scalar value of a one-element var, downloaded from the backend at once
  // (a host round trip: inside a training step read it with
  // Backend::ReadAtStepEnd instead).
  float item(Var v);

  // Scratch from the arena (the backend's memory), valid until Reset();
  // 64-byte aligned, not zeroed.
  float* AllocateFloats(int64_t count);
  int32_t* AllocateInts(int64_t count);
  // Host staging for values drawn on the host and uploaded (random
  // offsets): valid until the next call; grows only.
  int32_t* HostInts(int64_t count);

  // Seeds d(loss)/d(loss) = 1 (loss must have one element) and runs every
  // node backward (nothing when the loss depends on no gradient-requiring
  // value). Parameter gradients ACCUMULATE into their sets' buffers
  // (call ParameterSet::ZeroGrad between steps). `listener`, if given, hears
  // of each parameter as soon as its gradient is final, and may stop the
  // pass between nodes.
  void Backward(Var loss, GradientListener* listener = nullptr);

  // Forgets all values and nodes; the arena is rewound, not freed.
  void Reset();

  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  // Bytes the arena holds (grows on the first steps only).
  int64_t arena_bytes() const;

 private:
  struct Block {
    char* data = nullptr;
    int64_t capacity = 0;
  };
  void* AllocateBytes(int64_t bytes);

  Backend* backend_;
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<Block> blocks_;
  int current_block_ = 0;
  int64_t block_used_ = 0;
  std::vector<int> last_use_;  // Backward scratch: per value, smallest node index using it
  std::vector<int32_t> host_ints_;
};

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_TAPE_H_
