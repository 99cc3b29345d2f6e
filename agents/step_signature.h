// The signatures of the agents' steps (nn::Backend::RunStep: a step's
// signature names everything its program depends on besides device memory).
#ifndef TROUPE_AGENTS_STEP_SIGNATURE_H_
#define TROUPE_AGENTS_STEP_SIGNATURE_H_

#include <cstdint>
#include <initializer_list>

#include "common/fnv1a.h"

namespace troupe::agents {

// Which kind of step, the first word hashed: two kinds never share a signature.
enum class StepKind : int64_t { kD4pgUpdate = 1, kFrameScatter = 2 };

// The hash of `kind` and `numbers` (shapes, settings, replicas): no string
// made, as it is taken every execution.
inline uint64_t StepSignature(StepKind kind, std::initializer_list<int64_t> numbers) {
  uint64_t hash = Fnv1a64(reinterpret_cast<const char*>(&kind), sizeof(kind));
  for (const int64_t n : numbers) hash = Fnv1a64(reinterpret_cast<const char*>(&n), sizeof(n), hash);
  return hash;
}

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_STEP_SIGNATURE_H_
