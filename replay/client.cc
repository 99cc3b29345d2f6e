#include "replay/client.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::replay {

FieldValue FieldValue::Dense(proto::DType dtype, absl::Span<const int64_t> shape, const void* data) {
  FieldValue value;
  value.dtype = dtype;
  value.bytes = static_cast<size_t>(DTypeSize(dtype));
  for (int64_t d : shape) value.bytes *= static_cast<size_t>(std::max<int64_t>(d, 0));
  value.shape.assign(shape.begin(), shape.end());
  value.data = data;
  return value;
}

FieldValue FieldValue::Frames(absl::Span<const uint64_t> keys) {
  FieldValue value;
  value.frame_keys.assign(keys.begin(), keys.end());
  return value;
}

Writer::Writer(const WriterOptions& options)
    : options_(options),
      encoder_({.codec = options.codec,
                .level = options.compression_level,
                .group = options.reference_frames ? 8 : 0,
                .window = options.frame_window}) {}

proto::FrameData* Writer::AddFrame(proto::Compression codec, int height, int width, int channels) {
  proto::FrameData* frame = request_.add_frames();
  frame->set_key(next_frame_key_++);
  if (!spare_tensors_.empty()) {
    spare_tensors_.back()->Clear();  // keeps its data's capacity
    frame->set_allocated_pixels(spare_tensors_.back().release());
    spare_tensors_.pop_back();
  }
  proto::Tensor* t = frame->mutable_pixels();
  t->set_dtype(proto::DTYPE_UINT8);
  t->add_shape(height);
  t->add_shape(width);
  t->add_shape(channels);
  t->set_compression(codec);
  return frame;
}

absl::StatusOr<uint64_t> Writer::AppendFrame(const uint8_t* pixels, int height, int width, int channels) {
  if (height <= 0 || width <= 0 || channels <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("AppendFrame: bad frame shape ", height, "x", width, "x", channels));
  }
  // Compress here (against a recent similar frame when that pays), so the
  // server stores what it receives.
  const uint64_t key = next_frame_key_;
  encoder_.Encode(key, pixels, height, width, channels, &encoded_);
  proto::FrameData* frame = AddFrame(options_.codec, height, width, channels);
  if (encoded_.has_reference) frame->set_reference_key(encoded_.reference_key);
  request_bytes_ += static_cast<int64_t>(encoded_.data.size());
  // (The frame's old buffer, of a frame encoded earlier, takes the next.)
  frame->mutable_pixels()->mutable_data()->swap(encoded_.data);
  return key;
}

absl::StatusOr<uint64_t> Writer::AppendCompressedFrame(std::string data, proto::Compression codec, int height,
                                                       int width, int channels) {
  if (height <= 0 || width <= 0 || channels <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("AppendCompressedFrame: bad frame shape ", height, "x", width, "x",
                                                   channels));
  }
  const uint64_t key = next_frame_key_;
  proto::FrameData* frame = AddFrame(codec, height, width, channels);
  request_bytes_ += static_cast<int64_t>(data.size());
  frame->mutable_pixels()->set_data(std::move(data));
  return key;
}

absl::StatusOr<uint64_t> Writer::AppendCompressedFrame(std::string data, proto::Compression codec, int height,
                                                       int width, int channels, uint64_t reference_key) {
  // The reference must be one the server still holds when this frame arrives.
  if (reference_key >= next_frame_key_ || reference_key + static_cast<uint64_t>(options_.frame_window) <= next_frame_key_) {
    return absl::InvalidArgumentError(absl::StrCat("AppendCompressedFrame: reference frame key ", reference_key,
                                                   " is not among the last ", options_.frame_window,
                                                   " appended frames"));
  }
  ASSIGN_OR_RETURN(uint64_t key, AppendCompressedFrame(std::move(data), codec, height, width, channels));
  request_.mutable_frames(request_.frames_size() - 1)->set_reference_key(reference_key);
  return key;
}

absl::Status Writer::Insert(const std::string& table, double priority, absl::Span<const FieldValue> fields) {
  // Check frame keys against the window before queueing.
  const uint64_t oldest = next_frame_key_ > static_cast<uint64_t>(options_.frame_window)
                              ? next_frame_key_ - options_.frame_window
                              : 0;
  for (size_t f = 0; f < fields.size(); ++f) {
    for (uint64_t key : fields[f].frame_keys) {
      if (key >= next_frame_key_ || key < oldest) {
        return absl::InvalidArgumentError(absl::StrCat("Insert into '", table, "' field ", f, ": frame key ", key,
                                                       " is not among the last ", options_.frame_window,
                                                       " appended frames [", oldest, ", ", next_frame_key_, ")"));
      }
    }
  }
  // Items of one table and field layout share a group: append to the last
  // one when this item is laid out as it is, else start a new group.
  proto::ItemGroup* group =
      request_.item_groups_size() > 0 ? request_.mutable_item_groups(request_.item_groups_size() - 1) : nullptr;
  auto same_layout = [&] {
    if (group->table() != table || group->fields_size() != static_cast<int>(fields.size())) return false;
    for (size_t f = 0; f < fields.size(); ++f) {
      const proto::FieldLayout& layout = group->fields(f);
      const FieldValue& value = fields[f];
      if (!value.frame_keys.empty()) {
        if (layout.frames() != static_cast<int>(value.frame_keys.size())) return false;
      } else if (layout.frames() != 0 || layout.dtype() != value.dtype ||
                 !std::equal(value.shape.begin(), value.shape.end(), layout.shape().begin(), layout.shape().end())) {
        return false;
      }
    }
    return true;
  };
  if (group == nullptr || !same_layout()) {
    group = request_.add_item_groups();
    group->set_table(table);
    for (const FieldValue& value : fields) {
      proto::FieldLayout* layout = group->add_fields();
      if (!value.frame_keys.empty()) {
        layout->set_frames(static_cast<int>(value.frame_keys.size()));
      } else {
        layout->set_dtype(value.dtype);
        for (int64_t d : value.shape) layout->add_shape(d);
      }
    }
  }
  // The item's columns.
  group->add_priorities(priority);
  for (const FieldValue& value : fields) {
    if (!value.frame_keys.empty()) {
      for (uint64_t key : value.frame_keys) group->add_frame_keys(key);
    } else {
      group->mutable_dense()->append(static_cast<const char*>(value.data), value.bytes);
      request_bytes_ += static_cast<int64_t>(value.bytes);
    }
  }
  ++request_items_;
  ++items_queued_;
  if (request_items_ >= options_.max_items_per_request || request_bytes_ >= options_.max_request_bytes) {
    return SendQueued(/*ack=*/false);
  }
  return absl::OkStatus();
}

absl::Status Writer::Flush() { return SendQueued(/*ack=*/true); }

absl::Status Writer::Resume() {
  return absl::UnimplementedError("Resume: this writer is not resumable (WriterOptions::resumable, over gRPC)");
}

absl::Status Writer::SendQueued(bool ack) {
  // The server may forget frames that no later item can use.
  request_.set_forget_frames_before(
      next_frame_key_ > static_cast<uint64_t>(options_.frame_window) ? next_frame_key_ - options_.frame_window : 0);
  request_.set_ack(ack);
  const int items = request_items_;
  const int64_t bytes = static_cast<int64_t>(request_.ByteSizeLong());
  bytes_sent_ += bytes;
  absl::Status status = Send(&request_, items, bytes);
  Reclaim(&request_);
  if (!spare_requests_.empty()) {  // (request_ is then an empty one Send left for the one it took)
    request_.Swap(&spare_requests_.back());
    spare_requests_.pop_back();
  }
  request_bytes_ = 0;
  request_items_ = 0;
  if (status.ok()) items_sent_ += items;
  return status;
}

void Writer::Reclaim(proto::InsertRequest* request) {
  for (proto::FrameData& frame : *request->mutable_frames()) {
    if (spare_tensors_.size() >= kMaxSpareTensors) break;
    if (frame.has_pixels()) spare_tensors_.emplace_back(frame.release_pixels());
  }
  request->Clear();
}

void Writer::Recycle(proto::InsertRequest* request) {
  Reclaim(request);
  if (spare_requests_.size() >= kMaxSpareRequests) return;
  spare_requests_.emplace_back();
  spare_requests_.back().Swap(request);
}

namespace {

// Embedded writer: the same InsertSession the gRPC service uses, without
// the network.
class LocalWriter : public Writer {
 public:
  LocalWriter(Replay* replay, const WriterOptions& options) : Writer(options), session_(replay) {}

  absl::Status Close() override {
    if (closed_) return absl::FailedPreconditionError("writer already closed");
    absl::Status status = Flush();
    closed_ = true;
    return status;
  }

 protected:
  absl::Status Send(proto::InsertRequest* request, int /*items*/, int64_t /*bytes*/) override {
    if (closed_ && (request->items_size() > 0 || request->item_groups_size() > 0)) {
      return absl::FailedPreconditionError("writer is closed");
    }
    RETURN_IF_ERROR(session_.Prepare(request));
    return session_.InsertPending(absl::InfiniteDuration());
  }

 private:
  InsertSession session_;
  bool closed_ = false;
};

class LocalSampler : public Sampler {
 public:
  LocalSampler(Table* table, const SamplerOptions& options) : table_(table), options_(options) {
    items_.reserve(options.batch_size);
  }

  absl::Status Next(SampledBatch* batch) override {
    if (options_.num_batches > 0 && batches_ >= options_.num_batches) {
      return absl::OutOfRangeError(absl::StrCat("sampler gave its ", options_.num_batches, " batches"));
    }
    // Pick under the table lock, then copy and decode without it.
    items_.clear();
    int64_t table_size = 0;
    RETURN_IF_ERROR(TakeItems(&table_size));
    ShapeBatch(table_->signature(), options_.batch_size, batch, options_.frame_references);
    absl::Status status;
    if (options_.frame_references) {
      FillBatchReferences(table_->signature(), items_, table_size, table_->prioritized(),
                          table_->config().importance_exponent(), batch);
    } else {
      status = FillBatch(table_->signature(), items_, table_size, table_->prioritized(),
                         table_->config().importance_exponent(), decoder_, batch);
    }
    items_.clear();
    ++batches_;
    return status;
  }

  void Cancel() override { cancelled_ = true; }

 private:
  // The batch's items into items_: waits on the rate limiter in slices of
  // kCancelLatency (a cancel is seen between them) up to the options' timeout.
  absl::Status TakeItems(int64_t* table_size) {
    const absl::Time deadline = options_.timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                                             : absl::Now() + options_.timeout;
    for (;;) {
      if (cancelled_) return absl::CancelledError(absl::StrCat("sampler of table '", table_->name(), "' cancelled"));
      const absl::Duration slice = std::clamp(deadline - absl::Now(), absl::ZeroDuration(), kCancelLatency);
      absl::Status status = table_->Sample(options_.batch_size, slice, &items_, table_size);
      if (!absl::IsDeadlineExceeded(status)) return status;
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("table '", table_->name(), "': no full batch of ",
                                                        options_.batch_size, " within ",
                                                        absl::FormatDuration(options_.timeout), " (rate limiter: ",
                                                        status.message(), ")"));
      }
    }
  }

  Table* table_;
  SamplerOptions options_;
  std::atomic<bool> cancelled_ = false;
  std::vector<SampledItem> items_;
  FrameDecoder decoder_;
  int64_t batches_ = 0;
};

class LocalClient : public ReplayClient {
 public:
  explicit LocalClient(Replay* replay) : replay_(replay) {}

  absl::StatusOr<std::unique_ptr<Writer>> NewWriter(const WriterOptions& options) override {
    return std::make_unique<LocalWriter>(replay_, options);
  }
  absl::StatusOr<std::unique_ptr<Sampler>> NewSampler(const SamplerOptions& options) override {
    ASSIGN_OR_RETURN(Table * table, replay_->FindTable(options.table));
    if (options.batch_size < 1) {
      return absl::InvalidArgumentError(absl::StrCat("batch_size is ", options.batch_size, ", must be >= 1"));
    }
    return std::make_unique<LocalSampler>(table, options);
  }
  absl::StatusOr<int64_t> MutatePriorities(const proto::MutatePrioritiesRequest& request) override {
    return replay_->MutatePriorities(request);
  }
  absl::StatusOr<proto::InfoResponse> Info() override { return replay_->Info(); }
  absl::StatusOr<int64_t> Checkpoint(const std::string& name) override { return replay_->CheckpointByName(name); }
  absl::StatusOr<int64_t> Restore(const std::string& name) override { return replay_->RestoreByName(name); }

 private:
  Replay* replay_;
};

}  // namespace

std::unique_ptr<ReplayClient> NewLocalClient(Replay* replay) { return std::make_unique<LocalClient>(replay); }

}  // namespace troupe::replay
