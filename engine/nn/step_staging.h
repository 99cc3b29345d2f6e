// A step's inputs from the host gathered for one upload (the host part of
// Backend::RunStep's contract): each input appends its values to `host` and
// keeps their offset; the owner uploads `host` whole into device memory and
// sets `device` to it, and the step's device part reads each input at
// device + offset. A replayed step binds the same device buffer every time,
// so the owner keeps one per kind of step (the same offsets each update).
//
//   nn::StepStaging staging;
//   const int64_t at = staging.Append(values, 3 * sizeof(float));   // Adam's lr, c1, c2 (Optimizer::Prepare)
//   ... device.Upload(staging.host.data(), buffer.data(), ...); staging.device = buffer.data();
//   ... in the step: a kernel reads staging.device + at
#ifndef TROUPE_ENGINE_NN_STEP_STAGING_H_
#define TROUPE_ENGINE_NN_STEP_STAGING_H_

#include <cstdint>
#include <cstring>
#include <vector>

namespace troupe::nn {

struct StepStaging {
  std::vector<float> host;   // whole 4-byte words, each input's at its offset
  float* device = nullptr;   // where the owner uploaded `host` (null until it has)

  // Appends `bytes` of `data`, padded to whole words; returns their offset.
  int64_t Append(const void* data, int64_t bytes) {
    const auto offset = static_cast<int64_t>(host.size());
    host.resize(host.size() + static_cast<size_t>((bytes + 3) / 4));
    std::memcpy(host.data() + offset, data, static_cast<size_t>(bytes));
    return offset;
  }
  void Clear() {
    host.clear();
    device = nullptr;
  }
};

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_STEP_STAGING_H_
