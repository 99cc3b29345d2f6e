#include "engine/nn/backend.h"

#include <algorithm>
#include <cstdio>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace troupe::nn {

Backend::~Backend() {
  if (!scratch_pool_.empty() || !retired_scratch_.empty()) {
    std::fprintf(stderr, "backend destroyed with its scratch pool (%zu blocks) unreleased: its destructor must call "
                 "ReleaseScratchPool\n", scratch_pool_.size() + retired_scratch_.size());
    std::abort();
  }
}

float* Backend::Temporaries::Floats(int64_t count) {
  Backend& b = backend_;
  if (!b.in_step_) {
    for (void* p : b.retired_scratch_) b.Free(p);
    b.retired_scratch_.clear();
  }
  const size_t slot = b.scratch_in_use_++;
  if (slot >= b.scratch_pool_.size()) b.scratch_pool_.resize(slot + 1);
  ScratchBlock& block = b.scratch_pool_[slot];
  const size_t bytes = sizeof(float) * static_cast<size_t>(std::max<int64_t>(count, 1));
  if (block.bytes < bytes) {
    // A step that used the outgrown block may still read it (PJRT records a
    // step before it runs): it is freed outside a step.
    if (block.data != nullptr) b.retired_scratch_.push_back(block.data);
    block.data = b.AllocateScratch(bytes);
    block.bytes = bytes;
  }
  return static_cast<float*>(block.data);
}

void Backend::ReleaseScratchPool() {
  for (const ScratchBlock& block : scratch_pool_) Free(block.data);
  for (void* p : retired_scratch_) Free(p);
  scratch_pool_.clear();
  retired_scratch_.clear();
}

// --- Memory accounting ----------------------------------------------------------

size_t Backend::CheckBudget(size_t bytes) {
  std::lock_guard<std::mutex> lock(memory_mu_);
  if (memory_budget_ > 0 && memory_in_use_ + bytes > memory_budget_) {
    const auto mib = [](size_t b) { return static_cast<double>(b) / double(1 << 20); };
    std::fprintf(stderr,
                 "%s backend: out of its memory budget: %.2f MiB asked with %.2f MiB in use, over the budget of "
                 "%.2f MiB (engine.device_memory_mib)\n",
                 name().c_str(), mib(bytes), mib(memory_in_use_), mib(memory_budget_));
    std::abort();
  }
  memory_in_use_ += bytes;  // held from here: two threads cannot both pass the budget
  peak_memory_ = std::max(peak_memory_, memory_in_use_);
  return bytes;
}

void* Backend::Account(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(memory_mu_);
  allocation_bytes_[p] = bytes;
  return p;
}

void Backend::Free(void* p) {
  if (p == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(memory_mu_);
    auto it = allocation_bytes_.find(p);
    if (it != allocation_bytes_.end()) {
      memory_in_use_ -= it->second;
      allocation_bytes_.erase(it);
    }
  }
  DeviceFree(p);
}

void Backend::set_memory_budget(size_t bytes) {
  std::lock_guard<std::mutex> lock(memory_mu_);
  memory_budget_ = bytes;
}
size_t Backend::memory_budget() const {
  std::lock_guard<std::mutex> lock(memory_mu_);
  return memory_budget_;
}
size_t Backend::memory_in_use() const {
  std::lock_guard<std::mutex> lock(memory_mu_);
  return memory_in_use_;
}
size_t Backend::peak_memory() const {
  std::lock_guard<std::mutex> lock(memory_mu_);
  return peak_memory_;
}
void Backend::ResetPeakMemory() {
  std::lock_guard<std::mutex> lock(memory_mu_);
  peak_memory_ = memory_in_use_;
}

void Backend::BeginStep() {
  if (in_step_) {
    std::fprintf(stderr, "%s backend: BeginStep inside a step (steps do not nest)\n", name().c_str());
    std::abort();
  }
  in_step_ = true;
  ++steps_begun_;
}

void Backend::EndStep() {
  if (!in_step_) {
    std::fprintf(stderr, "%s backend: EndStep outside a step\n", name().c_str());
    std::abort();
  }
  in_step_ = false;
  for (const DeferredRead& r : TakeDeferredReads()) DownloadRead(r);
}

// A late read's copy of its bytes, in a buffer a landed read left (no
// allocation per step once as many as are in flight were made).
std::vector<std::byte>& Backend::Staged(const DeferredRead& r) {
  std::vector<std::byte> staged;
  if (!spare_staging_.empty()) {
    staged = std::move(spare_staging_.back());
    spare_staging_.pop_back();
  }
  staged.resize(r.bytes);
  unlanded_.push_back({steps_begun_, r.host, std::move(staged), nullptr});
  return unlanded_.back().staged;
}

void Backend::CopyRead(const DeferredRead& r, const void* bytes) {
  std::memcpy(late_reads_ ? Staged(r).data() : r.host, bytes, r.bytes);
}

void Backend::DownloadRead(const DeferredRead& r) {
  // Kept by value when late: the next step may write the device memory read here.
  Download(r.device, late_reads_ ? Staged(r).data() : r.host, r.bytes);
}

void Backend::KeepLateRead(std::function<void()> land) {
  unlanded_.push_back({steps_begun_, nullptr, {}, std::move(land)});
}

void Backend::LandReads(uint64_t through_step) {
  while (!unlanded_.empty() && unlanded_.front().step <= through_step) {
    LateRead read = std::move(unlanded_.front());
    unlanded_.pop_front();
    if (read.land) {
      read.land();
    } else {
      std::memcpy(read.host, read.staged.data(), read.staged.size());
      spare_staging_.push_back(std::move(read.staged));
    }
  }
}

size_t Backend::steps_unlanded() const {
  size_t steps = 0;
  for (size_t i = 0; i < unlanded_.size(); ++i) steps += i == 0 || unlanded_[i].step != unlanded_[i - 1].step;
  return steps;
}

void Backend::RunStep(uint64_t /*signature*/, const std::function<void()>& device_part) {
  StepScope step(*this);
  device_part();
}

namespace {
[[noreturn]] void NoCollectiveInStep(const Backend& backend, const char* what, int64_t count) {
  std::fprintf(stderr, "%s backend: %s of %lld floats, but its steps run with no other replicas\n",
               backend.name().c_str(), what, static_cast<long long>(count));
  std::abort();
}
}  // namespace

void Backend::AllReduceInStep(float*, int64_t count, bool, const ReplicaGroups*) {
  NoCollectiveInStep(*this, "AllReduceInStep", count);
}
void Backend::ReduceScatterInStep(const float*, float*, int64_t part, bool) {
  NoCollectiveInStep(*this, "ReduceScatterInStep", part);
}
void Backend::AllGatherInStep(const float*, float*, int64_t part) {
  NoCollectiveInStep(*this, "AllGatherInStep", part);
}

void Backend::ReadAtStepEnd(const void* device, void* host, size_t bytes) {
  if (!in_step_) {
    Download(device, host, bytes);
    return;
  }
  deferred_reads_.push_back({device, host, bytes});
}

}  // namespace troupe::nn
