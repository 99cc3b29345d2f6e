// The rendezvous of K replicas of one process that run each compiled step as
// ONE program on devices 0..K-1, as TF-Replicator ran a step on a TPU's
// cores.
//
// Holds: the arrivals of one step, and the K-replica executables (compiled
// once per program, found again by its fingerprint). Not: recording the
// program (each replica's backend records its own: program_recorder.h), nor
// a single replica's programs (program_cache.h).
#ifndef TROUPE_ENGINE_PJRT_REPLICA_GROUP_H_
#define TROUPE_ENGINE_PJRT_REPLICA_GROUP_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/pjrt/plugin.h"
#include "engine/pjrt/stablehlo.h"

namespace troupe::pjrt {

// Made once per Replicator and shared by its K backends (replica r on device
// r). Inside a step their collectives are stablehlo.all_reduce ops of the
// program (PjrtBackend::AllReduceInStep); at EndStep every replica hands in
// its program and arguments, and the last to arrive compiles the program
// for K replicas (once per text), executes it once with the K argument
// lists and hands each replica its results. Replicas that recorded
// different programs (by fingerprint), or one that does not arrive within the timeout, abort
// the process naming it (a step cannot be half run).
class PjrtReplicaGroup {
 public:
  explicit PjrtReplicaGroup(int replicas, std::chrono::seconds timeout = std::chrono::seconds(600))
      : replicas_(replicas), timeout_(timeout), arrivals_(replicas, nullptr) {}
  ~PjrtReplicaGroup();
  PjrtReplicaGroup(const PjrtReplicaGroup&) = delete;
  PjrtReplicaGroup& operator=(const PjrtReplicaGroup&) = delete;
  int size() const { return replicas_; }

  // For PjrtBackend::EndStep. One replica's part of a step's execution.
  struct Arrival {
    const std::string* text;
    Fingerprint fingerprint;  // of *text: what the replicas' programs are compared and found by
    const std::vector<capi::Buffer*>* args;
    std::vector<capi::Buffer*> outputs;  // sized by the replica; filled by the execution
    double compile_seconds = 0;          // set on the replica that compiled (or loaded) the program
    bool from_cache = false;             // it came from the on-disk cache
  };
  // Blocks until every replica has arrived; the last one runs the program
  // (compiled once per program, found again by its fingerprint; on disk
  // under `cache_dir` as a single step's).
  void Execute(int replica, Arrival* arrival, const std::shared_ptr<Client>& client, const std::string& cache_dir);

 private:
  const int replicas_;
  const std::chrono::seconds timeout_;
  std::mutex mu_;
  std::condition_variable done_;
  std::vector<Arrival*> arrivals_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::shared_ptr<Client> client_;
  std::unordered_map<Fingerprint, capi::LoadedExecutable*, FingerprintHash> executables_;
};

}  // namespace troupe::pjrt

#endif  // TROUPE_ENGINE_PJRT_REPLICA_GROUP_H_
