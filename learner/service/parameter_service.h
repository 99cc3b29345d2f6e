// The learner's Parameters service: actors and evaluators follow the latest
// policy parameters over one server-streaming `Get` each.
//
// A ParameterStore holds the newest version as one serialized-once message
// (the policy's parameters are one contiguous buffer, sent as one tensor).
// Each Get call is a GetReactor:
//   1. On start it registers with the store. If the store has a version newer
//      than the client's `have_version`, it writes it.
//   2. When a write completes it writes again if a newer version appeared
//      meanwhile (versions published during a write are coalesced: the
//      client gets the newest), else it waits.
//   3. Publish() wakes every waiting reactor, which then writes (step 2).
//   4. On cancel (client gone) or server shutdown it finishes; OnDone
//      unregisters it and deletes it.
// No reaction blocks: the store's mutex guards only pointer swaps and the
// reactor list.
#ifndef TROUPE_LEARNER_SERVICE_PARAMETER_SERVICE_H_
#define TROUPE_LEARNER_SERVICE_PARAMETER_SERVICE_H_

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/parameters.grpc.pb.h"

namespace troupe::learner {

class ParameterStore {
 public:
  // Makes `parameters` (named `name`, shape [size]) the newest version.
  // `version` must increase; older or equal versions are ignored.
  void Publish(int64_t version, const std::string& name, std::span<const float> parameters);
  // The newest update, or null before the first Publish.
  std::shared_ptr<const proto::ParametersUpdate> Latest() const;
  int64_t version() const;

  // Reactor registration (see the header comment). Internal to the service.
  // OnPublished runs under the store's lock (so a listener is never called
  // after RemoveListener returns) and must not call back into the store.
  class Listener {
   public:
    virtual ~Listener() = default;
    virtual void OnPublished(std::shared_ptr<const proto::ParametersUpdate> latest, bool closed) = 0;
  };
  // Registers `listener` and calls its OnPublished with the current state.
  void AddListener(Listener* listener);
  void RemoveListener(Listener* listener);
  // Ends every stream (server shutdown): listeners finish with UNAVAILABLE.
  void Close();
  bool closed() const;

 private:
  mutable absl::Mutex mutex_;
  std::shared_ptr<const proto::ParametersUpdate> latest_ ABSL_GUARDED_BY(mutex_);
  std::set<Listener*> listeners_ ABSL_GUARDED_BY(mutex_);
  bool closed_ ABSL_GUARDED_BY(mutex_) = false;
};

class ParameterService final : public proto::Parameters::CallbackService {
 public:
  // `store` must outlive the service and every call on it.
  explicit ParameterService(ParameterStore* store) : store_(store) {}
  grpc::ServerWriteReactor<proto::ParametersUpdate>* Get(grpc::CallbackServerContext* context,
                                                          const proto::GetParametersRequest* request) override;

 private:
  ParameterStore* store_;
};

}  // namespace troupe::learner

#endif  // TROUPE_LEARNER_SERVICE_PARAMETER_SERVICE_H_
