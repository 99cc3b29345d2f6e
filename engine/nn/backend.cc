#include "engine/nn/backend.h"

#include <cstdio>
#include <cstdlib>

namespace troupe::nn {

void Backend::BeginStep() {
  if (in_step_) {
    std::fprintf(stderr, "%s backend: BeginStep inside a step (steps do not nest)\n", name().c_str());
    std::abort();
  }
  in_step_ = true;
}

void Backend::EndStep() {
  if (!in_step_) {
    std::fprintf(stderr, "%s backend: EndStep outside a step\n", name().c_str());
    std::abort();
  }
  in_step_ = false;
  for (const DeferredRead& r : TakeDeferredReads()) Download(r.device, r.host, r.bytes);
}

void Backend::AllReduceInStep(float* data, int64_t count, bool mean) {
  std::fprintf(stderr, "%s backend: AllReduceInStep of %lld floats, but its steps run with no other replicas\n",
               name().c_str(), static_cast<long long>(count));
  std::abort();
}

void Backend::ReadAtStepEnd(const void* device, void* host, size_t bytes) {
  if (!in_step_) {
    Download(device, host, bytes);
    return;
  }
  deferred_reads_.push_back({device, host, bytes});
}

}  // namespace troupe::nn
