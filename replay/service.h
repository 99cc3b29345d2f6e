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

#include "absl/time/time.h"
#include "proto/replay.grpc.pb.h"
#include "replay/replay.h"
#include "replay/worker_pool.h"

namespace troupe::replay {

// How long one worker task waits on a rate limiter before requeueing.
inline constexpr absl::Duration kWaitSlice = absl::Milliseconds(20);

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

 private:
  Replay* replay_;
  std::unique_ptr<WorkerPool> workers_;
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_SERVICE_H_
