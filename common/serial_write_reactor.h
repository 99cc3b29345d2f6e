// A server-streaming gRPC reactor that writes one message at a time, for
// streams fed by a publisher (the learner's Parameters stream, the
// evaluator's episode stream). This class owns the write/finish state
// machine; a subclass says what to write next:
//   - NextLocked() returns the next message to write, or null for "nothing
//     yet" (it may call FinishLocked instead). Called with mutex_ held
//     whenever no write is in flight: after the subclass calls
//     MaybeWriteLocked() and after each write completes.
//   - WrittenLocked() runs (mutex_ held) when a write has completed, before
//     the next NextLocked().
// A write that fails finishes the stream UNAVAILABLE with `write_failed`; a
// finish requested while a write is in flight waits for that write; a client
// cancel (or server shutdown) finishes CANCELLED. Statuses are absl::Status
// inside and converted to grpc::Status only when the stream finishes. The message being written
// is kept alive until its write completes. Subclasses implement OnDone
// (unregister, then `delete this`).
#ifndef TROUPE_COMMON_SERIAL_WRITE_REACTOR_H_
#define TROUPE_COMMON_SERIAL_WRITE_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"

namespace troupe {

template <typename Message>
class SerialWriteReactor : public grpc::ServerWriteReactor<Message> {
 public:
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mutex_);
    in_flight_.reset();
    WrittenLocked();
    if (finishing_) {
      this->Finish(ToGrpcStatus(pending_finish_));
    } else if (!ok) {
      finishing_ = true;
      this->Finish(ToGrpcStatus(absl::UnavailableError(write_failed_)));
    } else {
      MaybeWriteLocked();
    }
  }

  void OnCancel() override {
    absl::MutexLock lock(&mutex_);
    FinishLocked(absl::CancelledError("the client cancelled the stream"));
  }

 protected:
  explicit SerialWriteReactor(std::string write_failed) : write_failed_(std::move(write_failed)) {}

  virtual std::shared_ptr<const Message> NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) = 0;
  virtual void WrittenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {}

  // Starts writing NextLocked() unless a write is in flight or the stream is
  // finishing.
  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (finishing_ || in_flight_ != nullptr) return;
    std::shared_ptr<const Message> next = NextLocked();
    if (finishing_ || next == nullptr) return;
    in_flight_ = std::move(next);
    this->StartWrite(in_flight_.get());
  }

  // Finishes with `status` (converted at this, the service boundary) now, or
  // once the write in flight completes. Later calls are ignored.
  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (finishing_) return;
    finishing_ = true;
    if (in_flight_ != nullptr) {
      pending_finish_ = status;
    } else {
      this->Finish(ToGrpcStatus(status));
    }
  }

  absl::Mutex mutex_;  // guards this class's state and the subclass's

 private:
  const std::string write_failed_;
  // The message being written; null when no write is in flight.
  std::shared_ptr<const Message> in_flight_ ABSL_GUARDED_BY(mutex_);
  bool finishing_ ABSL_GUARDED_BY(mutex_) = false;
  absl::Status pending_finish_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace troupe

#endif  // TROUPE_COMMON_SERIAL_WRITE_REACTOR_H_
