// The policy's pixel input for a batch of envs: each env's last k frames in
// the replay layout uint8 [B, k, H, W, 3] (frames oldest first), kept as a
// ring per env so a new frame costs one frame copy. (The env pool runs with
// frame_stack 1 for actors; stacking happens here and, by frame keys, in
// replay.)
#ifndef TROUPE_ACTORS_OBSERVATION_STACK_H_
#define TROUPE_ACTORS_OBSERVATION_STACK_H_

#include <cstdint>
#include <cstring>
#include <vector>

namespace troupe::actors {

class ObservationStack {
 public:
  ObservationStack(int num_envs, int frames, int height, int width)
      : frames_(frames), frame_bytes_(size_t(height) * width * 3), newest_(num_envs, 0),
        ring_(size_t(num_envs) * frames * frame_bytes_), stacked_(ring_.size()) {}

  // A new episode: `frame` fills env's whole stack.
  void Reset(int env, const uint8_t* frame) {
    for (int k = 0; k < frames_; ++k) std::memcpy(slot(env, k), frame, frame_bytes_);
    newest_[env] = frames_ - 1;
  }
  // The env's newest frame.
  void Push(int env, const uint8_t* frame) {
    newest_[env] = (newest_[env] + 1) % frames_;
    std::memcpy(slot(env, newest_[env]), frame, frame_bytes_);
  }
  // Every env's stack, oldest first: [num_envs, k, H, W, 3].
  const uint8_t* Stacked() {
    for (size_t env = 0; env < newest_.size(); ++env) {
      for (int k = 0; k < frames_; ++k) {
        const int ring_index = (newest_[env] + 1 + k) % frames_;
        std::memcpy(stacked_.data() + (env * frames_ + k) * frame_bytes_, slot(int(env), ring_index), frame_bytes_);
      }
    }
    return stacked_.data();
  }

 private:
  uint8_t* slot(int env, int k) { return ring_.data() + (size_t(env) * frames_ + k) * frame_bytes_; }

  int frames_;
  size_t frame_bytes_;
  std::vector<int> newest_;
  std::vector<uint8_t> ring_;
  std::vector<uint8_t> stacked_;
};

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_OBSERVATION_STACK_H_
