#include "learner/service/parameter_service.h"

#include <cstring>

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
  std::lock_guard lock(mutex_);
  if (closed_ || (latest_ && latest_->version() >= version)) return;
  latest_ = std::move(update);
  for (Listener* listener : listeners_) listener->OnPublished(latest_, closed_);
}

std::shared_ptr<const proto::ParametersUpdate> ParameterStore::Latest() const {
  std::lock_guard lock(mutex_);
  return latest_;
}

int64_t ParameterStore::version() const {
  std::lock_guard lock(mutex_);
  return latest_ ? latest_->version() : 0;
}

void ParameterStore::AddListener(Listener* listener) {
  std::lock_guard lock(mutex_);
  listeners_.insert(listener);
  listener->OnPublished(latest_, closed_);
}

void ParameterStore::RemoveListener(Listener* listener) {
  std::lock_guard lock(mutex_);
  listeners_.erase(listener);
}

void ParameterStore::Close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  for (Listener* listener : listeners_) listener->OnPublished(latest_, closed_);
}

bool ParameterStore::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

namespace {

// Lock order: the store's mutex, then the reactor's.
class GetReactor final : public grpc::ServerWriteReactor<proto::ParametersUpdate>, public ParameterStore::Listener {
 public:
  GetReactor(ParameterStore* store, int64_t have_version) : store_(store), sent_version_(have_version) {
    // Step 1: register; the store tells us at once what it has.
    store_->AddListener(this);
  }

  // Step 3: a new version (or the store closing).
  void OnPublished(std::shared_ptr<const proto::ParametersUpdate> latest, bool closed) override {
    std::lock_guard lock(mutex_);
    latest_ = std::move(latest);
    closed_ = closed;
    MaybeWriteLocked();
  }

  // Step 2: the previous write finished.
  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mutex_);
    writing_ = false;
    in_flight_.reset();
    if (finishing_) {
      Finish(pending_finish_);
    } else if (!ok) {
      finishing_ = true;
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "parameter stream write failed"));
    } else {
      MaybeWriteLocked();
    }
  }

  // Step 4: the client cancelled (or the server is shutting down).
  void OnCancel() override {
    std::lock_guard lock(mutex_);
    FinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    store_->RemoveListener(this);  // no OnPublished runs after this returns
    { std::lock_guard lock(mutex_); }
    delete this;
  }

 private:
  void MaybeWriteLocked() {
    if (finishing_ || writing_) return;
    if (closed_) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the learner is shutting down"));
      return;
    }
    if (!latest_ || latest_->version() <= sent_version_) return;
    sent_version_ = latest_->version();
    in_flight_ = latest_;
    writing_ = true;
    StartWrite(in_flight_.get());
  }

  void FinishLocked(const grpc::Status& status) {
    if (finishing_) return;
    finishing_ = true;
    if (writing_) {
      pending_finish_ = status;  // finished once the write completes
    } else {
      Finish(status);
    }
  }

  ParameterStore* store_;
  std::mutex mutex_;
  // All guarded by mutex_.
  int64_t sent_version_;
  std::shared_ptr<const proto::ParametersUpdate> latest_;
  std::shared_ptr<const proto::ParametersUpdate> in_flight_;  // alive until its write completes
  bool closed_ = false;
  bool writing_ = false;
  bool finishing_ = false;
  grpc::Status pending_finish_;
};

}  // namespace

grpc::ServerWriteReactor<proto::ParametersUpdate>* ParameterService::Get(grpc::CallbackServerContext* context,
                                                                         const proto::GetParametersRequest* request) {
  return new GetReactor(store_, request->have_version());
}

}  // namespace troupe::learner
