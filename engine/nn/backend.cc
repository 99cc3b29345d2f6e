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

void Backend::CopyRead(const DeferredRead& r, const void* bytes) {
  if (!late_reads_) {
    std::memcpy(r.host, bytes, r.bytes);
    return;
  }
  const auto* begin = static_cast<const std::byte*>(bytes);
  KeepLateRead([staged = std::vector<std::byte>(begin, begin + r.bytes), host = r.host] {
    std::memcpy(host, staged.data(), staged.size());
  });
}

void Backend::DownloadRead(const DeferredRead& r) {
  if (!late_reads_) {
    Download(r.device, r.host, r.bytes);
    return;
  }
  // Kept by value: the next step may write the device memory read here.
  std::vector<std::byte> staged(r.bytes);
  Download(r.device, staged.data(), r.bytes);
  CopyRead(r, staged.data());
}

void Backend::KeepLateRead(std::function<void()> land) { unlanded_.push_back({steps_begun_, std::move(land)}); }

void Backend::LandReads(uint64_t through_step) {
  while (!unlanded_.empty() && unlanded_.front().step <= through_step) {
    std::function<void()> land = std::move(unlanded_.front().land);
    unlanded_.pop_front();
    land();
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
