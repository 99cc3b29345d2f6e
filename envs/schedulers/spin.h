// Spin, then sleep: how the pool's threads hand batches to each other.
#ifndef TROUPE_ENVS_SCHEDULERS_SPIN_H_
#define TROUPE_ENVS_SCHEDULERS_SPIN_H_

#include <chrono>

namespace troupe::envs {

// Spins (with the CPU's pause hint) until `done()` or `budget` has passed;
// returns done(). A batch of cheap envs is over in tens of microseconds,
// sooner than a wake-up from the kernel, so both sides of a hand-off look
// before they sleep.
template <typename Done>
bool SpinFor(std::chrono::microseconds budget, Done done) {
  const auto until = std::chrono::steady_clock::now() + budget;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    for (int i = 0; i < 16; ++i) __builtin_ia32_pause();
  }
  return true;
}

// How long a thread spins before it sleeps.
inline constexpr std::chrono::microseconds kSpin{200};

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_SCHEDULERS_SPIN_H_
