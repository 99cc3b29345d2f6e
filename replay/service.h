// Replay's gRPC service on the callback API. Reactions never block: work
// that may wait (a rate-limited insert, a sample batch, a checkpoint) goes to
// a WorkerPool, which waits in short slices and requeues, so a stream stuck
// on one table never holds a thread that another stream needs.
//
// Insert (bidirectional stream; InsertReactor):
//   1. Start reading a request.
//   2. Read done: if the stream ended (client finished or went away), finish
//      OK; whatever the client had not sent is simply absent, and frames it
//      sent but no item used are dropped with the stream.
//   3. Prepare the request (InsertSession::Prepare). A bad request finishes
//      the stream with its status (INVALID_ARGUMENT, NOT_FOUND) and inserts
//      nothing; other streams are unaffected.
//   4. Insert its items without waiting. If the rate limiter blocks, the
//      worker pool retries in slices of kWaitSlice until inserted, the
//      table's insert_timeout_ms passes (DEADLINE_EXCEEDED), or the client
//      cancels (CANCELLED).
//   5. If the request asked for an ack, write InsertResponse and go to 1
//      when the write is done; else go to 1.
//
// Writer sessions (InsertRequest.writer != 0; a resumable writer,
// replay/client.h): the InsertSession belongs to the writer, not to one
// stream, so that a writer whose stream broke re-sends on a new stream what
// was not acknowledged and nothing is inserted twice.
//   a. The stream's first request names the writer. A session it already
//      has, not held by another stream, is taken over (items the old
//      stream had queued but not inserted are dropped: the writer re-sends
//      them); a session still held by an open stream is refused
//      UNAVAILABLE (the old stream ends when its client's cancel, or the
//      server's keepalive, reaches it; the writer retries); an unknown one
//      is made, unless the request says `resume` (FAILED_PRECONDITION: the
//      server restarted or the session expired).
//   b. Steps 3 to 5 run on the writer's session (InsertSession::Prepare
//      skips what was inserted already).
//   c. When the stream is done the session is let go, and kept for
//      kWriterSessionLifetime (at most kMaxIdleWriterSessions of them, the
//      oldest dropped first) for the writer to come back.
//
// Sample (server stream; SampleReactor):
//   1. Check the request (table exists: NOT_FOUND; batch_size in [1, 1<<20]:
//      INVALID_ARGUMENT) and schedule step 2.
//   2. On a worker: take items from the table in slices of kWaitSlice until
//      the batch is full; past the request's timeout_ms, finish
//      DEADLINE_EXCEEDED; if the client cancelled, finish CANCELLED; if the
//      server is closing, finish UNAVAILABLE so clients retry elsewhere.
//   3. Build the response (unique frames once, still compressed, each after
//      the frame it was coded against; with frames_once, only the frames
//      this stream has not sent, the others by id, and every 16 batches the
//      ids of sent frames replay let go) and write it.
//   4. Write done: a failed write means the client is gone: finish. After
//      num_batches batches finish OK; else go to 2.
//
// MutatePriorities and Info answer at once; Checkpoint and Restore run on
// the worker pool and finish from there. They take a checkpoint NAME inside
// the server's replay.checkpoint_dir, never a path (Replay::CheckpointByName).
//
// Locking: reactors are driven by one gRPC reaction or one worker task at a
// time (never both: a task is scheduled only while no read or write is in
// flight); the only state shared with OnCancel is an atomic flag.
#ifndef TROUPE_REPLAY_SERVICE_H_
#define TROUPE_REPLAY_SERVICE_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/replay.grpc.pb.h"
#include "replay/replay.h"
#include "replay/worker_pool.h"

namespace troupe::replay {

// How long one worker task waits on a rate limiter before requeueing.
inline constexpr absl::Duration kWaitSlice = absl::Milliseconds(20);
// How long a writer session no stream holds is kept, and how many are.
inline constexpr absl::Duration kWriterSessionLifetime = absl::Minutes(10);
inline constexpr int kMaxIdleWriterSessions = 256;

class ReplayService final : public proto::Replay::CallbackService {
 public:
  // `replay` must outlive the service.
  ReplayService(Replay* replay, int worker_threads);
  ~ReplayService() override;

  grpc::ServerBidiReactor<proto::InsertRequest, proto::InsertResponse>* Insert(
      grpc::CallbackServerContext* context) override;
  grpc::ServerWriteReactor<proto::SampleResponse>* Sample(grpc::CallbackServerContext* context,
                                                          const proto::SampleRequest* request) override;
  grpc::ServerUnaryReactor* MutatePriorities(grpc::CallbackServerContext* context,
                                             const proto::MutatePrioritiesRequest* request,
                                             proto::MutatePrioritiesResponse* response) override;
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context, const proto::InfoRequest* request,
                                 proto::InfoResponse* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context, const proto::CheckpointRequest* request,
                                       proto::CheckpointResponse* response) override;
  grpc::ServerUnaryReactor* Restore(grpc::CallbackServerContext* context, const proto::RestoreRequest* request,
                                    proto::RestoreResponse* response) override;

  Replay* replay() { return replay_; }
  WorkerPool& workers() { return *workers_; }

  // A writer's session and whether a stream holds it.
  struct WriterSession {
    explicit WriterSession(Replay* replay) : session(replay) {}
    InsertSession session;
    bool held = false;   // guarded by the service's sessions mutex
    absl::Time let_go;   // when the last stream let it go (idle sessions)
  };
  // Step a: the session of `writer` for a new stream, now held by it.
  // Unavailable while another stream holds it; FailedPrecondition when
  // `resume` and the server has none.
  absl::StatusOr<std::shared_ptr<WriterSession>> TakeWriterSession(uint64_t writer, bool resume);
  // Step c.
  void LetGoWriterSession(WriterSession* session);

 private:
  // Drops idle sessions past kWriterSessionLifetime, then the oldest idle
  // ones beyond kMaxIdleWriterSessions.
  void ExpireWriterSessions() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sessions_mutex_);

  Replay* replay_;
  std::unique_ptr<WorkerPool> workers_;
  absl::Mutex sessions_mutex_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<WriterSession>> sessions_ ABSL_GUARDED_BY(sessions_mutex_);
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_SERVICE_H_
