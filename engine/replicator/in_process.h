// The in-process backend: K replicas as K threads of one process sharing a
// group. Used by tests and by one-machine runs; with members made on_device,
// K replicas sharing one device (one GPU) that reduce on it.
//
// Locking: all group state is under InProcessGroup::mu_; replicas wait on
// cv_ with the group's timeout. The replica that arrives last performs the
// reduction into every replica's buffer, then advances `completed_`.
#ifndef TROUPE_ENGINE_REPLICATOR_IN_PROCESS_H_
#define TROUPE_ENGINE_REPLICATOR_IN_PROCESS_H_

#include <chrono>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/replicator/interface.h"

namespace troupe::replicator {

class InProcessGroup {
 public:
  InProcessGroup(int num_replicas, std::chrono::milliseconds timeout);
  int num_replicas() const { return num_replicas_; }
  // Replica `id`'s end; the group must outlive it. `on_device`: the replicas
  // share one device whose memory each one's backend can address (the CPU;
  // one GPU for all), and device buffers are reduced there
  // (Collectives::AllReduceOnDevice) instead of through the host.
  std::unique_ptr<Collectives> Member(int id, bool on_device = false);

 private:
  friend class InProcessCollectives;
  struct Slot {
    int64_t seq = -1;  // the collective this replica has posted (-1: none yet)
    int kind = 0;
    int64_t count = 0;
    int root = 0;
    const float* in = nullptr;
    float* out = nullptr;
    int64_t out_count = 0;
    nn::Backend* backend = nullptr;  // kAllReduceOnDevice: the replica's backend
  };
  absl::Status Run(int id, int64_t seq, Slot slot, ReduceOp op);
  void Fail(int id, const absl::Status& status);

  const int num_replicas_;
  const std::chrono::milliseconds timeout_;
  // Replicas wait on conditions of mu_ (every replica posted, or done, or
  // failed), re-evaluated whenever another replica releases it.
  absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  int64_t completed_ ABSL_GUARDED_BY(mu_) = -1;  // highest collective finished by all
  absl::Status failure_ ABSL_GUARDED_BY(mu_);    // first failure, shared by all
  std::vector<float> scratch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace troupe::replicator

#endif  // TROUPE_ENGINE_REPLICATOR_IN_PROCESS_H_
