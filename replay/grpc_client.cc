#include "replay/grpc_client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "proto/replay.grpc.pb.h"

namespace troupe::replay {
namespace {

// A random non-zero writer session id (proto/replay.proto InsertRequest.writer).
uint64_t NewWriterId() {
  std::random_device device;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t(device()) << 32) ^ device();
  return id;
}

// Steps of a resumable writer (WriterOptions::resumable):
//   1. Send numbers each request (writer, sequence, first_item) and keeps
//      it in unacked_ before writing it, so a request is never lost on the
//      client's side, whether the write works or not.
//   2. An ack (Flush, or the writer's own once kMaxUnacknowledgedBytes
//      wait) confirms every request before it: unacked_ empties.
//   3. A failed write or read ends the stream; later Sends only keep
//      their requests (1) and return the stream's status.
//   4. Resume waits for the channel to connect, opens a new stream and re-sends
//      unacked_ in order, the first marked `resume`, the last asking for
//      an ack (2); the server skips what it already inserted.
class GrpcWriter : public Writer {
 public:
  GrpcWriter(std::shared_ptr<grpc::Channel> channel, proto::Replay::Stub* stub, const WriterOptions& options)
      : Writer(options), channel_(std::move(channel)), stub_(stub), writer_id_(options.resumable ? NewWriterId() : 0) {
    OpenStream();
  }

  ~GrpcWriter() override {
    // Abandoned without Close: cancel, so the server drops the stream.
    if (!finished_) {
      context_->TryCancel();
      (void)stream_->Finish();
    }
  }

  absl::Status Close() override {
    if (closed_ || (finished_ && writer_id_ == 0)) return status_;
    absl::Status flushed = Flush();
    if (!flushed.ok()) return flushed;
    stream_->WritesDone();
    closed_ = true;
    return FinishStream(/*closing=*/true);
  }

  absl::Status Resume() override {
    if (writer_id_ == 0) return Writer::Resume();
    if (closed_) return absl::FailedPreconditionError("Resume: the writer is closed");
    if (!finished_ && unacked_.empty()) return absl::OkStatus();
    // 4. A new stream (the old one cancelled if it is still open), once
    // the channel has connected or kResumeConnectWait passed. The wait
    // drives the connection: after a failure a call fails at once, and
    // with no thread waiting on the channel gRPC advances a connection only
    // on its backup poller (every 5 s), too slowly for a lossy link's
    // handshakes. Not connected, the stream then fails with the reason.
    if (!finished_) {
      context_->TryCancel();
      (void)stream_->Finish();
      finished_ = true;
    }
    (void)channel_->WaitForConnected(std::chrono::system_clock::now() + kResumeConnectWait);
    OpenStream();
    if (unacked_.empty() && sequence_ == 0) return absl::OkStatus();  // nothing was ever sent
    if (unacked_.empty()) {
      // Nothing to re-send: an empty request confirms the session.
      proto::InsertRequest empty;
      Number(&empty, 0);
      unacked_.push_back(std::move(empty));
    }
    for (size_t i = 0; i < unacked_.size(); ++i) {
      proto::InsertRequest& request = unacked_[i];
      // (A session whose first request may never have arrived is made anew.)
      request.set_resume(i == 0 && request.sequence() > 1);
      request.set_ack(i + 1 == unacked_.size());
      if (!stream_->Write(request)) return FinishStream();
    }
    proto::InsertResponse response;
    if (!stream_->Read(&response)) return FinishStream();
    Acknowledged();
    return absl::OkStatus();
  }

  int64_t items_unacknowledged() const override { return unacked_items_; }

 protected:
  absl::Status Send(proto::InsertRequest* request, int items, int64_t bytes) override {
    if (closed_) return absl::FailedPreconditionError("writer is closed");
    if (writer_id_ == 0) {
      if (finished_) return status_;
      // A failed write or read means the server ended the stream: its status says why.
      if (!stream_->Write(*request)) return FinishStream();
      if (request->ack()) {
        proto::InsertResponse response;
        if (!stream_->Read(&response)) return FinishStream();
      }
      return absl::OkStatus();
    }
    // 1. Numbered and kept until acknowledged.
    Number(request, items);
    unacked_bytes_ += bytes;
    if (unacked_bytes_ >= kMaxUnacknowledgedBytes) request->set_ack(true);
    unacked_.emplace_back();
    unacked_.back().Swap(request);
    const proto::InsertRequest& sent = unacked_.back();
    // 3. A broken stream keeps requests for Resume.
    if (finished_) return status_;
    if (!stream_->Write(sent)) return FinishStream();
    if (sent.ack()) {
      // 2. The ack covers every request before it.
      proto::InsertResponse response;
      if (!stream_->Read(&response)) return FinishStream();
      Acknowledged();
    }
    return absl::OkStatus();
  }

 private:
  void OpenStream() {
    stream_.reset();
    context_ = std::make_unique<grpc::ClientContext>();
    stream_ = stub_->Insert(context_.get());
    finished_ = false;
    status_ = absl::OkStatus();
  }

  // Sets the session fields of the writer's next request of `items` items.
  void Number(proto::InsertRequest* request, int items) {
    request->set_writer(writer_id_);
    request->set_sequence(++sequence_);
    request->set_first_item(items_numbered_);
    items_numbered_ += items;
    unacked_items_ += items;
  }

  void Acknowledged() {
    for (proto::InsertRequest& request : unacked_) Recycle(&request);
    unacked_.clear();
    unacked_items_ = 0;
    unacked_bytes_ = 0;
  }

  // Ends the stream; an OK end is an error unless we were closing.
  absl::Status FinishStream(bool closing = false) {
    finished_ = true;
    status_ = FromGrpcStatus(stream_->Finish());
    if (status_.ok() && !closing) status_ = absl::UnavailableError("replay insert stream ended by the server");
    return status_;
  }

  std::shared_ptr<grpc::Channel> channel_;
  proto::Replay::Stub* stub_;
  const uint64_t writer_id_;  // 0: not resumable
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<proto::InsertRequest, proto::InsertResponse>> stream_;
  bool finished_ = false;
  bool closed_ = false;
  absl::Status status_;
  // The session (resumable writers only).
  int64_t sequence_ = 0;
  int64_t items_numbered_ = 0;
  std::vector<proto::InsertRequest> unacked_;  // (cleared, it keeps its capacity)
  int64_t unacked_items_ = 0;
  int64_t unacked_bytes_ = 0;
};

class GrpcSampler : public Sampler {
 public:
  GrpcSampler(proto::Replay::Stub* stub, const SamplerOptions& options) {
    proto::SampleRequest request;
    request.set_table(options.table);
    request.set_batch_size(options.batch_size);
    request.set_num_batches(options.num_batches);
    if (options.timeout != absl::InfiniteDuration()) {
      request.set_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(options.timeout)));
    }
    request.set_frames_once(options.frame_references);
    frame_references_ = options.frame_references;
    table_ = options.table;
    reader_ = stub->Sample(&context_, request);
  }

  ~GrpcSampler() override {
    if (!finished_) {
      context_.TryCancel();
      (void)reader_->Finish();
    }
  }

  absl::Status Next(SampledBatch* batch) override {
    if (finished_) return status_;
    if (cancelled_) return Cancelled();
    if (!reader_->Read(&response_)) {
      finished_ = true;
      status_ = FromGrpcStatus(reader_->Finish());
      if (cancelled_) status_ = Cancelled();
      if (status_.ok()) status_ = absl::OutOfRangeError("sample stream gave all its batches");
      return status_;
    }
    if (cancelled_) return Cancelled();
    return frame_references_ ? UnpackReferences(batch) : Unpack(batch);
  }

  // The stream's context cancelled: a Read blocked now returns at once.
  void Cancel() override {
    cancelled_ = true;
    context_.TryCancel();
  }

 private:
  absl::Status Cancelled() const {
    return absl::CancelledError(absl::StrCat("sample stream of table '", table_, "' cancelled"));
  }

  // frames_once: the frames this stream sent, kept (as a FrameStore's,
  // checked as replay checks them) while the server holds them; the batch
  // refers to them (SampledBatch::frames).
  absl::Status UnpackReferences(SampledBatch* batch) {
    for (uint64_t id : response_.forgotten_frame_ids()) held_.erase(id);
    if (response_.frame_ids_size() != response_.frames_size() ||
        response_.frame_reference_ids_size() != response_.frames_size()) {
      return absl::DataLossError("sample response: frame ids do not match its frames");
    }
    for (int k = 0; k < response_.frames_size(); ++k) {
      proto::Tensor* t = response_.mutable_frames(k);
      if (t->shape_size() != 3) return absl::DataLossError("sample response: a frame is not [H, W, C]");
      FramePtr reference;
      if (const uint64_t ref = response_.frame_reference_ids(k); ref != 0) {
        auto it = held_.find(ref);
        if (it == held_.end()) return absl::DataLossError("sample response: a frame's reference was never sent");
        reference = it->second;
      }
      ASSIGN_OR_RETURN(FramePtr frame,
                       store_.FromCompressed(std::move(*t->mutable_data()), t->compression(),
                                             static_cast<int32_t>(t->shape(0)), static_cast<int32_t>(t->shape(1)),
                                             static_cast<int32_t>(t->shape(2)), std::move(reference), decoder_,
                                             absl::StrCat("sample response frame ", k)));
      held_[response_.frame_ids(k)] = std::move(frame);
    }
    // Keys, weights, dense columns; pixel fields shaped, their frames referenced.
    const int64_t n = response_.keys_size();
    CopyKeysAndWeights(batch);
    int64_t frames_per_item = 0;
    for (const proto::SampledField& in : response_.fields()) frames_per_item += n > 0 ? in.frame_id_size() / n : 0;
    batch->frames.resize(n * frames_per_item);
    int64_t offset = 0;
    for (int f = 0; f < response_.fields_size(); ++f) {
      const proto::SampledField& in = response_.fields(f);
      SampledField& out = batch->fields[f];
      if (CopyField(in, out, /*pixels=*/in.frame_id_size() > 0)) continue;
      out.data.clear();
      const int64_t frames = in.frame_id_size() / n;
      if (out.shape.size() != 5 || out.shape[0] != n || out.shape[1] != frames || frames * n != in.frame_id_size()) {
        return absl::DataLossError("sample response: pixel field shape does not match its frame ids");
      }
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < frames; ++j) {
          auto it = held_.find(in.frame_id(i * frames + j));
          if (it == held_.end()) return absl::DataLossError("sample response: a frame id that was never sent");
          batch->frames[i * frames_per_item + offset + j] = it->second;
        }
      }
      offset += frames;
    }
    return absl::OkStatus();
  }

  // The response's keys, probabilities, weights and table size into `batch`,
  // its fields sized to the response's.
  void CopyKeysAndWeights(SampledBatch* batch) const {
    batch->keys.assign(response_.keys().begin(), response_.keys().end());
    batch->probabilities.assign(response_.probabilities().begin(), response_.probabilities().end());
    batch->weights.assign(response_.weights().begin(), response_.weights().end());
    batch->table_size = response_.table_size();
    batch->fields.resize(response_.fields_size());
  }

  // A field's dtype and shape; a dense field's data too (true: done).
  static bool CopyField(const proto::SampledField& in, SampledField& out, bool pixels) {
    out.dtype = in.tensor().dtype();
    out.shape.assign(in.tensor().shape().begin(), in.tensor().shape().end());
    if (pixels) return false;
    out.data.assign(in.tensor().data().begin(), in.tensor().data().end());
    return true;
  }

  // Rebuilds the batch from the response: dense columns copied, each
  // distinct frame decoded once and copied to its other places.
  absl::Status Unpack(SampledBatch* batch) {
    const int64_t n = response_.keys_size();
    CopyKeysAndWeights(batch);
    decoded_at_.assign(response_.frames_size(), nullptr);
    scratch_used_ = 0;
    for (int f = 0; f < response_.fields_size(); ++f) {
      const proto::SampledField& in = response_.fields(f);
      SampledField& out = batch->fields[f];
      if (CopyField(in, out, /*pixels=*/in.frame_index_size() > 0)) continue;
      int64_t frame_bytes = 1;
      for (size_t d = 2; d < out.shape.size(); ++d) frame_bytes *= out.shape[d];
      out.data.resize(in.frame_index_size() * frame_bytes);
      if (out.shape.size() != 5 || out.shape[0] != n || out.shape[0] * out.shape[1] != in.frame_index_size()) {
        return absl::DataLossError("sample response: pixel field shape does not match its frame indices");
      }
      for (int k = 0; k < in.frame_index_size(); ++k) {
        const int index = in.frame_index(k);
        if (index < 0 || index >= response_.frames_size()) return absl::DataLossError("sample response: bad frame index");
        uint8_t* dst = out.data.data() + k * frame_bytes;
        ASSIGN_OR_RETURN(const uint8_t* at, Place(index, frame_bytes, dst));
        if (at != dst) std::memcpy(dst, at, frame_bytes);
      }
    }
    return absl::OkStatus();
  }

  // Where response frame `index` is decoded (decoding it, after its
  // reference, into `dst` or else scratch space, if not yet).
  absl::StatusOr<const uint8_t*> Place(int index, int64_t frame_bytes, uint8_t* dst) {
    if (decoded_at_[index] != nullptr) return decoded_at_[index];
    const uint8_t* reference = nullptr;
    if (response_.frame_references_size() > 0) {
      if (response_.frame_references_size() != response_.frames_size()) {
        return absl::DataLossError("sample response: frame references do not match frames");
      }
      const int r = response_.frame_references(index);
      if (r >= index || r < -1) return absl::DataLossError("sample response: bad frame reference");
      if (r >= 0) {
        ASSIGN_OR_RETURN(reference, Place(r, frame_bytes, nullptr));
      }
    }
    uint8_t* out = dst;
    if (out == nullptr) {
      // Scratch for references no item shows; reused across batches.
      if (scratch_used_ == scratch_.size()) scratch_.emplace_back();
      scratch_[scratch_used_].resize(frame_bytes);
      out = scratch_[scratch_used_++].data();
    }
    const proto::Tensor& frame = response_.frames(index);
    RETURN_IF_ERROR(decompressor_.Decode(frame.data(), frame.compression(), frame_bytes, out, reference));
    decoded_at_[index] = out;
    return out;
  }

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<proto::SampleResponse>> reader_;
  proto::SampleResponse response_;
  FrameDecoder decoder_;             // checks the frames it keeps (frames once)
  FrameDecompressor decompressor_;  // decodes a response's frames
  std::vector<const uint8_t*> decoded_at_;
  std::vector<std::vector<uint8_t>> scratch_;
  size_t scratch_used_ = 0;
  bool finished_ = false;
  std::string table_;
  std::atomic<bool> cancelled_ = false;  // Cancel, from any thread
  absl::Status status_;
  bool frame_references_ = false;
  FrameStore store_;                                   // frames_once: the frames received ...
  absl::flat_hash_map<uint64_t, FramePtr> held_;      // ... by the server's id
};

class GrpcClient : public ReplayClient {
 public:
  GrpcClient(const std::string& address, const GrpcClientOptions& options) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
    args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
    auto channel = NewSecureChannel(options.credentials, address, args);
    if (!channel.ok()) {
      channel_error_ = channel.status();
      return;
    }
    channel_ = *std::move(channel);
    stub_ = proto::Replay::NewStub(channel_);
  }
  explicit GrpcClient(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)), stub_(proto::Replay::NewStub(channel_)) {}

  absl::StatusOr<std::unique_ptr<Writer>> NewWriter(const WriterOptions& options) override {
    RETURN_IF_ERROR(channel_error_);
    return std::make_unique<GrpcWriter>(channel_, stub_.get(), options);
  }
  absl::StatusOr<std::unique_ptr<Sampler>> NewSampler(const SamplerOptions& options) override {
    RETURN_IF_ERROR(channel_error_);
    if (options.batch_size < 1) {
      return absl::InvalidArgumentError(absl::StrCat("batch_size is ", options.batch_size, ", must be >= 1"));
    }
    return std::make_unique<GrpcSampler>(stub_.get(), options);
  }
  absl::StatusOr<int64_t> MutatePriorities(const proto::MutatePrioritiesRequest& request) override {
    RETURN_IF_ERROR(channel_error_);
    grpc::ClientContext context;
    proto::MutatePrioritiesResponse response;
    RETURN_IF_ERROR(FromGrpcStatus(stub_->MutatePriorities(&context, request, &response)));
    return response.missing();
  }
  absl::StatusOr<proto::InfoResponse> Info() override {
    RETURN_IF_ERROR(channel_error_);
    grpc::ClientContext context;
    proto::InfoResponse response;
    RETURN_IF_ERROR(FromGrpcStatus(stub_->Info(&context, proto::InfoRequest(), &response)));
    return response;
  }
  absl::StatusOr<int64_t> Checkpoint(const std::string& name) override {
    RETURN_IF_ERROR(channel_error_);
    grpc::ClientContext context;
    proto::CheckpointRequest request;
    request.set_name(name);
    proto::CheckpointResponse response;
    RETURN_IF_ERROR(FromGrpcStatus(stub_->Checkpoint(&context, request, &response)));
    return response.bytes();
  }
  absl::StatusOr<int64_t> Restore(const std::string& name) override {
    RETURN_IF_ERROR(channel_error_);
    grpc::ClientContext context;
    proto::RestoreRequest request;
    request.set_name(name);
    proto::RestoreResponse response;
    RETURN_IF_ERROR(FromGrpcStatus(stub_->Restore(&context, request, &response)));
    return response.items();
  }

 private:
  absl::Status channel_error_;  // why there is no channel (credentials that cannot reach the address)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Replay::Stub> stub_;
};

}  // namespace

std::unique_ptr<ReplayClient> NewGrpcClient(const std::string& address, const GrpcClientOptions& options) {
  return std::make_unique<GrpcClient>(address, options);
}

std::unique_ptr<ReplayClient> NewGrpcClient(std::shared_ptr<grpc::Channel> channel) {
  return std::make_unique<GrpcClient>(std::move(channel));
}

}  // namespace troupe::replay
