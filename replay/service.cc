#include "replay/service.h"

#include <google/protobuf/arena.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "replay/client.h"

namespace troupe::replay {
namespace {

constexpr int kMaxBatchSize = 1 << 20;

// Steps of the Insert state machine are numbered as in service.h.
class InsertReactor : public grpc::ServerBidiReactor<proto::InsertRequest, proto::InsertResponse> {
 public:
  explicit InsertReactor(ReplayService* service)
      : service_(service),
        own_session_(service->replay()),
        session_(&own_session_),
        arena_(ArenaOptions(arena_block_, sizeof(arena_block_))) {
    ReadNext();  // 1
  }

  void OnReadDone(bool ok) override {
    // 2. The stream ended.
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    // a. A writer session: taken on the stream's first request.
    if (absl::Status status = TakeSession(); !status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    // 3. Check the whole request. Frame bytes move out of it into the store;
    // the rest is copied, so the request is done with here.
    ack_ = request_->ack();
    const int64_t skipped_before = session_->items_skipped();
    if (absl::Status status = session_->Prepare(request_); !status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    if (session_->items_skipped() > skipped_before) {
      std::fprintf(stderr, "replay: writer %016llx re-sent %lld items it had sent before; skipped (inserted already)\n",
                   static_cast<unsigned long long>(writer_), static_cast<long long>(session_->items_skipped() - skipped_before));
    }
    blocked_since_ = absl::InfiniteFuture();
    ContinueInsert(absl::ZeroDuration());
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client stopped reading acks"));
      return;
    }
    ReadNext();  // 5 -> 1
  }

  void OnCancel() override { cancelled_ = true; }
  void OnDone() override {
    if (writer_session_) service_->LetGoWriterSession(writer_session_.get());  // c
    delete this;
  }

 private:
  // a. The first request of a writer session's stream takes the session;
  // later requests must name the same writer.
  absl::Status TakeSession() {
    if (!first_request_) {
      if (request_->writer() != writer_) {
        return absl::InvalidArgumentError(absl::StrCat("insert stream of writer ", absl::Hex(writer_, absl::kZeroPad16),
                                                       ": a request names writer ",
                                                       absl::Hex(request_->writer(), absl::kZeroPad16)));
      }
      return absl::OkStatus();
    }
    first_request_ = false;
    writer_ = request_->writer();
    if (writer_ == 0) return absl::OkStatus();
    auto taken = service_->TakeWriterSession(writer_, request_->resume());
    if (!taken.ok()) return taken.status();
    writer_session_ = *std::move(taken);
    session_ = &writer_session_->session;
    if (request_->resume()) {
      std::fprintf(stderr, "replay: writer %016llx resumed its session on a new insert stream (%lld items inserted before)\n",
                   static_cast<unsigned long long>(writer_), static_cast<long long>(session_->items_inserted()));
    }
    return absl::OkStatus();
  }

  // 4. Inserts queued items, waiting at most `wait`; on a block hands the
  // rest to the worker pool.
  void ContinueInsert(absl::Duration wait) {
    absl::Status status = session_->InsertPending(wait);
    if (absl::IsDeadlineExceeded(status)) {
      const absl::Time now = absl::Now();
      if (blocked_since_ == absl::InfiniteFuture()) blocked_since_ = now;
      if (cancelled_) {
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "insert stream cancelled while rate limited"));
        return;
      }
      const absl::Duration limit = session_->pending_timeout();
      if (now - blocked_since_ >= limit) {
        Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            absl::StrCat("insert blocked by the rate limiter for more than ",
                                         absl::FormatDuration(limit), " (insert_timeout_ms)")));
        return;
      }
      service_->workers().Schedule([this] { ContinueInsert(kWaitSlice); });
      return;
    }
    if (absl::IsCancelled(status)) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, absl::StrCat(kReplayShuttingDown, ": ", status.message())));
      return;
    }
    if (!status.ok()) {
      Finish(ToGrpcStatus(status));
      return;
    }
    // 5. Ack if asked, then read on.
    if (ack_) {
      response_.set_items_inserted(session_->items_inserted());
      StartWrite(&response_);
      return;
    }
    ReadNext();
  }

  static google::protobuf::ArenaOptions ArenaOptions(char* block, size_t bytes) {
    google::protobuf::ArenaOptions options;
    options.initial_block = block;
    options.initial_block_size = bytes;
    return options;
  }

  // 1. Reads the next request into a fresh message on the arena (its
  // submessages and string objects come from one reused block instead of a
  // malloc each; frame bytes still get their own buffers, which the store
  // keeps).
  void ReadNext() {
    arena_.Reset();
    request_ = google::protobuf::Arena::CreateMessage<proto::InsertRequest>(&arena_);
    StartRead(request_);
  }

  ReplayService* service_;
  InsertSession own_session_;  // a stream without a writer session
  std::shared_ptr<ReplayService::WriterSession> writer_session_;
  InsertSession* session_;  // own_session_ or writer_session_'s
  bool first_request_ = true;
  uint64_t writer_ = 0;
  alignas(16) char arena_block_[64 << 10];
  google::protobuf::Arena arena_;
  proto::InsertRequest* request_ = nullptr;
  bool ack_ = false;
  proto::InsertResponse response_;
  absl::Time blocked_since_ = absl::InfiniteFuture();
  std::atomic<bool> cancelled_{false};
};

// Steps of the Sample state machine are numbered as in service.h.
class SampleReactor : public grpc::ServerWriteReactor<proto::SampleResponse> {
 public:
  SampleReactor(ReplayService* service, const proto::SampleRequest& request) : service_(service), request_(request) {
    // 1. Check the request.
    auto table = service->replay()->FindTable(request.table());
    if (!table.ok()) {
      Finish(ToGrpcStatus(table.status()));
      return;
    }
    if (request.batch_size() < 1 || request.batch_size() > kMaxBatchSize) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("batch_size is ", request.batch_size(), ", must be in [1, ", kMaxBatchSize, "]")));
      return;
    }
    table_ = *table;
    items_.reserve(request.batch_size());
    ScheduleBatch();
  }

  void OnWriteDone(bool ok) override {
    // 4. Client gone, done, or next batch.
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client stopped reading samples"));
      return;
    }
    ++batches_sent_;
    if (request_.num_batches() > 0 && batches_sent_ >= request_.num_batches()) {
      Finish(grpc::Status::OK);
      return;
    }
    ScheduleBatch();
  }

  void OnCancel() override { cancelled_ = true; }
  void OnDone() override { delete this; }

 private:
  void ScheduleBatch() {
    batch_started_ = absl::Now();
    service_->workers().Schedule([this] { TakeItems(); });
  }

  // 2. On a worker: fill the batch in slices.
  void TakeItems() {
    if (cancelled_) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "sample stream cancelled"));
      return;
    }
    int64_t table_size = 0;
    absl::Status status = table_->Sample(request_.batch_size(), kWaitSlice, &items_, &table_size);
    if (absl::IsDeadlineExceeded(status)) {
      if (request_.timeout_ms() > 0 && absl::Now() - batch_started_ >= absl::Milliseconds(request_.timeout_ms())) {
        items_.clear();
        Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            absl::StrCat("table '", table_->name(), "': no full batch of ", request_.batch_size(),
                                         " within ", request_.timeout_ms(), " ms (rate limiter: ", status.message(),
                                         ")")));
        return;
      }
      service_->workers().Schedule([this] { TakeItems(); });
      return;
    }
    if (!status.ok()) {
      items_.clear();
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, absl::StrCat(kReplayShuttingDown, ": ", status.message())));
      return;
    }
    table_size_ = table_size;
    BuildResponse();
    items_.clear();
    StartWrite(&response_);  // 3
  }

  // 3. Columns of the batch; each distinct frame once, as stored.
  void BuildResponse() {
    const Signature& signature = table_->signature();
    const int64_t n = static_cast<int64_t>(items_.size());
    response_.Clear();
    response_.set_table_size(table_size_);
    weights_.resize(n);
    ComputeWeights(items_, table_size_, table_->prioritized(), table_->config().importance_exponent(), weights_.data());
    for (int64_t i = 0; i < n; ++i) {
      response_.add_keys(items_[i].item->key);
      response_.add_probabilities(items_[i].probability);
      response_.add_weights(weights_[i]);
    }
    frame_index_.clear();
    any_reference_ = false;
    for (const FieldSpec& spec : signature.fields) {
      proto::SampledField* field = response_.add_fields();
      proto::Tensor* tensor = field->mutable_tensor();
      tensor->set_dtype(spec.dtype);
      tensor->add_shape(n);
      if (spec.frames > 0) tensor->add_shape(spec.frames);
      for (int64_t d : spec.shape) tensor->add_shape(d);
      if (spec.frames == 0) {
        std::string* data = tensor->mutable_data();
        data->resize(n * spec.bytes);
        for (int64_t i = 0; i < n; ++i) {
          std::memcpy(data->data() + i * spec.bytes, items_[i].item->dense.data() + spec.offset, spec.bytes);
        }
        continue;
      }
      for (int64_t i = 0; i < n; ++i) {
        for (int32_t j = 0; j < spec.frames; ++j) {
          const FramePtr& frame = items_[i].item->frames[spec.offset + j];
          if (request_.frames_once()) {
            field->add_frame_id(SendOnce(frame));
          } else {
            field->add_frame_index(AddFrame(*frame));
          }
        }
      }
    }
    if (!any_reference_) response_.clear_frame_references();
    // Frames sent earlier that replay let go: the client may drop them (a
    // pass over what was sent, every kForgetEvery batches).
    if (request_.frames_once() && ++batches_built_ % kForgetEvery == 0) {
      for (auto it = sent_.begin(); it != sent_.end();) {
        if (it->second.expired()) {
          response_.add_forgotten_frame_ids(it->first);
          sent_.erase(it++);
        } else {
          ++it;
        }
      }
    }
  }

  // frames_once: adds `frame` (after its reference) to the response unless
  // this stream sent it before; returns its id.
  uint64_t SendOnce(const FramePtr& frame) {
    if (sent_.contains(frame->id())) return frame->id();
    const uint64_t reference = frame->reference() != nullptr ? SendOnce(frame->reference()) : 0;
    AddStoredFrame(*frame);
    response_.add_frame_ids(frame->id());
    response_.add_frame_reference_ids(reference);
    sent_.emplace(frame->id(), frame);
    return frame->id();
  }

  // `frame` as stored (still compressed) appended to the response's frames.
  void AddStoredFrame(const Frame& frame) {
    proto::Tensor* stored = response_.add_frames();
    stored->set_dtype(proto::DTYPE_UINT8);
    stored->add_shape(frame.height());
    stored->add_shape(frame.width());
    stored->add_shape(frame.channels());
    stored->set_compression(frame.codec());
    stored->set_data(frame.data());
  }

  // Adds `frame` (after its reference) to the response once; returns its index.
  int32_t AddFrame(const Frame& frame) {
    auto it = frame_index_.find(&frame);
    if (it != frame_index_.end()) return it->second;
    const int32_t reference = frame.reference() != nullptr ? AddFrame(*frame.reference()) : -1;
    const int32_t index = response_.frames_size();
    frame_index_.emplace(&frame, index);
    AddStoredFrame(frame);
    response_.add_frame_references(reference);
    any_reference_ |= reference >= 0;
    return index;
  }

  ReplayService* service_;
  const proto::SampleRequest request_;
  Table* table_ = nullptr;
  std::vector<SampledItem> items_;
  std::vector<float> weights_;
  absl::flat_hash_map<const Frame*, int32_t> frame_index_;
  bool any_reference_ = false;
  // frames_once: the frames this stream sent, by id, while replay holds them.
  static constexpr int64_t kForgetEvery = 16;
  absl::flat_hash_map<uint64_t, std::weak_ptr<const Frame>> sent_;
  int64_t batches_built_ = 0;
  proto::SampleResponse response_;
  int64_t table_size_ = 0;
  int64_t batches_sent_ = 0;
  absl::Time batch_started_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace

ReplayService::ReplayService(Replay* replay, int worker_threads)
    : replay_(replay), workers_(std::make_unique<WorkerPool>(worker_threads)) {}

ReplayService::~ReplayService() = default;

absl::StatusOr<std::shared_ptr<ReplayService::WriterSession>> ReplayService::TakeWriterSession(uint64_t writer,
                                                                                               bool resume) {
  absl::MutexLock lock(&sessions_mutex_);
  ExpireWriterSessions();
  auto it = sessions_.find(writer);
  if (it == sessions_.end()) {
    if (resume) {
      return absl::FailedPreconditionError(absl::StrCat(
          "replay has no session of writer ", absl::Hex(writer, absl::kZeroPad16),
          " to resume (the server restarted, or the session was idle longer than ",
          absl::FormatDuration(kWriterSessionLifetime), "): what it had not had acknowledged is lost"));
    }
    it = sessions_.emplace(writer, std::make_shared<WriterSession>(replay_)).first;
  } else if (it->second->held) {
    return absl::UnavailableError(absl::StrCat("writer ", absl::Hex(writer, absl::kZeroPad16),
                                               "'s previous insert stream is still open on the server; retry once "
                                               "it has ended"));
  }
  it->second->held = true;
  // What the previous stream had queued but not inserted is re-sent by the writer.
  it->second->session.DropPending();
  return it->second;
}

void ReplayService::LetGoWriterSession(WriterSession* session) {
  absl::MutexLock lock(&sessions_mutex_);
  session->held = false;
  session->let_go = absl::Now();
  ExpireWriterSessions();
}

void ReplayService::ExpireWriterSessions() {
  const absl::Time now = absl::Now();
  std::vector<std::pair<absl::Time, uint64_t>> idle;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (!it->second->held && now - it->second->let_go > kWriterSessionLifetime) {
      sessions_.erase(it++);
      continue;
    }
    if (!it->second->held) idle.emplace_back(it->second->let_go, it->first);
    ++it;
  }
  if (idle.size() <= static_cast<size_t>(kMaxIdleWriterSessions)) return;
  std::sort(idle.begin(), idle.end());
  for (size_t i = 0; i + kMaxIdleWriterSessions < idle.size(); ++i) sessions_.erase(idle[i].second);
}

grpc::ServerBidiReactor<proto::InsertRequest, proto::InsertResponse>* ReplayService::Insert(
    grpc::CallbackServerContext* context) {
  return new InsertReactor(this);
}

grpc::ServerWriteReactor<proto::SampleResponse>* ReplayService::Sample(grpc::CallbackServerContext* context,
                                                                       const proto::SampleRequest* request) {
  return new SampleReactor(this, *request);
}

grpc::ServerUnaryReactor* ReplayService::MutatePriorities(grpc::CallbackServerContext* context,
                                                          const proto::MutatePrioritiesRequest* request,
                                                          proto::MutatePrioritiesResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto missing = replay_->MutatePriorities(*request);
  if (missing.ok()) response->set_missing(*missing);
  reactor->Finish(ToGrpcStatus(missing.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ReplayService::Info(grpc::CallbackServerContext* context, const proto::InfoRequest* request,
                                              proto::InfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  *response = replay_->Info();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ReplayService::Checkpoint(grpc::CallbackServerContext* context,
                                                    const proto::CheckpointRequest* request,
                                                    proto::CheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  workers_->Schedule([this, reactor, request, response] {
    auto bytes = replay_->CheckpointByName(request->name());
    if (bytes.ok()) {
      response->set_name(request->name());
      response->set_bytes(*bytes);
    }
    reactor->Finish(ToGrpcStatus(bytes.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ReplayService::Restore(grpc::CallbackServerContext* context,
                                                 const proto::RestoreRequest* request,
                                                 proto::RestoreResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  workers_->Schedule([this, reactor, request, response] {
    auto items = replay_->RestoreByName(request->name());
    if (items.ok()) response->set_items(*items);
    reactor->Finish(ToGrpcStatus(items.status()));
  });
  return reactor;
}

}  // namespace troupe::replay
