#include "learner/service/parameter_service.h"

#include <cstring>

#include "common/serial_write_reactor.h"

namespace troupe::learner {

void ParameterStore::Publish(int64_t version, const std::string& name, std::span<const float> parameters) {
  // Serialize outside the lock; swap in and tell the streams under it.
  auto update = std::make_shared<proto::ParametersUpdate>();
  update->set_version(version);
  proto::NamedTensor* named = update->add_parameters();
  named->set_name(name);
  proto::Tensor* tensor = named->mutable_tensor();
  tensor->set_dtype(proto::DTYPE_FLOAT32);
  tensor->add_shape(static_cast<int64_t>(parameters.size()));
  tensor->set_data(parameters.data(), parameters.size_bytes());
  absl::MutexLock lock(&mutex_);
  if (closed_ || (latest_ && latest_->version() >= version)) return;
  latest_ = std::move(update);
  for (Listener* listener : listeners_) listener->OnPublished(latest_, closed_);
}

std::shared_ptr<const proto::ParametersUpdate> ParameterStore::Latest() const {
  absl::MutexLock lock(&mutex_);
  return latest_;
}

int64_t ParameterStore::version() const {
  absl::MutexLock lock(&mutex_);
  return latest_ ? latest_->version() : 0;
}

void ParameterStore::AddListener(Listener* listener) {
  absl::MutexLock lock(&mutex_);
  listeners_.insert(listener);
  listener->OnPublished(latest_, closed_);
}

void ParameterStore::RemoveListener(Listener* listener) {
  absl::MutexLock lock(&mutex_);
  listeners_.erase(listener);
}

void ParameterStore::Close() {
  absl::MutexLock lock(&mutex_);
  closed_ = true;
  for (Listener* listener : listeners_) listener->OnPublished(latest_, closed_);
}

bool ParameterStore::closed() const {
  absl::MutexLock lock(&mutex_);
  return closed_;
}

namespace {

// Lock order: the store's mutex, then the reactor's.
class GetReactor final : public SerialWriteReactor<proto::ParametersUpdate>, public ParameterStore::Listener {
 public:
  GetReactor(ParameterStore* store, int64_t have_version)
      : SerialWriteReactor("parameter stream write failed"), store_(store), sent_version_(have_version) {
    // Register; the store tells us at once what it has.
    store_->AddListener(this);
  }

  // A new version (or the store closing).
  void OnPublished(std::shared_ptr<const proto::ParametersUpdate> latest, bool closed) override {
    absl::MutexLock lock(&mutex_);
    latest_ = std::move(latest);
    closed_ = closed;
    MaybeWriteLocked();
  }

  void OnDone() override {
    store_->RemoveListener(this);  // no OnPublished runs after this returns
    { absl::MutexLock lock(&mutex_); }
    delete this;
  }

 private:
  // Only the newest version is written; versions published during a write
  // are coalesced.
  std::shared_ptr<const proto::ParametersUpdate> NextLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (closed_) {
      FinishLocked(absl::UnavailableError("the learner is shutting down"));
      return nullptr;
    }
    if (!latest_ || latest_->version() <= sent_version_) return nullptr;
    sent_version_ = latest_->version();
    return latest_;
  }

  ParameterStore* store_;
  int64_t sent_version_ ABSL_GUARDED_BY(mutex_);
  std::shared_ptr<const proto::ParametersUpdate> latest_ ABSL_GUARDED_BY(mutex_);
  bool closed_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace

grpc::ServerWriteReactor<proto::ParametersUpdate>* ParameterService::Get(grpc::CallbackServerContext* context,
                                                                         const proto::GetParametersRequest* request) {
  return new GetReactor(store_, request->have_version());
}

}  // namespace troupe::learner
