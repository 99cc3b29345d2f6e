#include "engine/pjrt/replica_group.h"

#include <cstdio>
#include <cstdlib>

#include "absl/status/statusor.h"
#include "engine/pjrt/fatal.h"
#include "engine/pjrt/program_cache.h"

namespace troupe::pjrt {

PjrtReplicaGroup::~PjrtReplicaGroup() {
  for (auto& [text, executable] : executables_) client_->Destroy(executable);
}

void PjrtReplicaGroup::Execute(int replica, Arrival* arrival, const std::shared_ptr<Client>& client,
                               const std::string& cache_dir) {
  std::unique_lock<std::mutex> lock(mu_);
  if (arrivals_[replica] != nullptr) {
    std::fprintf(stderr, "PJRT replicas: replica %d arrived twice at one step\n", replica);
    std::abort();
  }
  arrivals_[replica] = arrival;
  const uint64_t generation = generation_;
  if (++arrived_ < replicas_) {
    if (!done_.wait_for(lock, timeout_, [&] { return generation_ != generation; })) {
      std::fprintf(stderr, "PJRT replicas: replica %d waited %llds for the others' step (%d of %d arrived)\n", replica,
                   static_cast<long long>(timeout_.count()), arrived_, replicas_);
      std::abort();
    }
    return;
  }
  // The last to arrive: one program for all.
  if (!client_) client_ = client;
  const Arrival& first = *arrivals_[0];
  for (int r = 1; r < replicas_; ++r) {
    if (arrivals_[r]->fingerprint != first.fingerprint) {
      std::fprintf(stderr, "PJRT replicas: replica %d recorded another step than replica 0 (%zu and %zu bytes)\n", r,
                   arrivals_[r]->text->size(), first.text->size());
      std::abort();
    }
  }
  auto it = executables_.find(first.fingerprint);
  if (it == executables_.end()) {
    absl::StatusOr<capi::LoadedExecutable*> executable =
        CompileProgram(*client_, cache_dir, *first.text, replicas_, &arrival->compile_seconds, &arrival->from_cache);
    if (!executable.ok()) {
      std::fprintf(stderr, "%s\n", first.text->c_str());
      Fatal(executable.status(), "a replicated step");
    }
    it = executables_.emplace(first.fingerprint, *executable).first;
  }
  std::vector<std::vector<capi::Buffer*>> args, outputs;
  for (int r = 0; r < replicas_; ++r) {
    args.push_back(*arrivals_[r]->args);
    outputs.push_back(std::move(arrivals_[r]->outputs));
  }
  Check(client_->ExecuteReplicated(it->second, args, outputs), "executing a replicated step");
  for (int r = 0; r < replicas_; ++r) {
    arrivals_[r]->outputs = std::move(outputs[r]);
    arrivals_[r] = nullptr;
  }
  arrived_ = 0;
  ++generation_;
  done_.notify_all();
}

}  // namespace troupe::pjrt
