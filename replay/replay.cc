#include "replay/replay.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "replay/checkpoint.h"

namespace troupe::replay {

namespace {

// The dimensions of field `spec` in a batch of `rows` items before its item
// shape, into dims: the rows, then a pixel field's frames. Returns how many.
size_t LeadingDims(const FieldSpec& spec, int64_t rows, int64_t (&dims)[2]) {
  dims[0] = rows;
  dims[1] = spec.frames;
  return spec.frames > 0 ? 2 : 1;
}

// The shape of field `spec` in a batch of `rows` items: [rows, (frames,) ...shape].
void BatchShape(const FieldSpec& spec, int64_t rows, std::vector<int64_t>* shape) {
  int64_t dims[2];
  shape->assign(dims, dims + LeadingDims(spec, rows, dims));
  shape->insert(shape->end(), spec.shape.begin(), spec.shape.end());
}

// Whether `shape` is BatchShape(spec, rows), without making it (CheckBatch
// runs on every update's batch).
bool HasBatchShape(const FieldSpec& spec, int64_t rows, const std::vector<int64_t>& shape) {
  int64_t dims[2];
  const size_t n = LeadingDims(spec, rows, dims);
  return shape.size() == n + spec.shape.size() && std::equal(dims, dims + n, shape.begin()) &&
         std::equal(spec.shape.begin(), spec.shape.end(), shape.begin() + static_cast<std::ptrdiff_t>(n));
}

// The bytes of field `spec` in a batch of `rows` items (0: a pixel field of frame references).
int64_t BatchBytes(const FieldSpec& spec, int64_t rows, bool frame_references) {
  const bool decoded = spec.frames == 0 || !frame_references;
  return decoded ? rows * spec.bytes * std::max(1, spec.frames) : 0;
}

}  // namespace

void ShapeBatch(const Signature& signature, int64_t batch_size, SampledBatch* batch, bool frame_references) {
  batch->keys.resize(batch_size);
  batch->probabilities.resize(batch_size);
  batch->weights.resize(batch_size);
  batch->fields.resize(signature.fields.size());
  for (size_t f = 0; f < signature.fields.size(); ++f) {
    const FieldSpec& spec = signature.fields[f];
    SampledField& field = batch->fields[f];
    field.dtype = spec.dtype;
    BatchShape(spec, batch_size, &field.shape);
    field.data.resize(BatchBytes(spec, batch_size, frame_references));
  }
  batch->frames.resize(frame_references ? batch_size * signature.num_frames : 0);
}

absl::Status CheckBatch(const Signature& signature, const SampledBatch& batch, int64_t rows, bool frame_references) {
  if (batch.fields.size() != signature.fields.size()) {
    std::vector<std::string> names;
    for (const FieldSpec& spec : signature.fields) names.push_back(spec.name);
    return absl::InvalidArgumentError(absl::StrCat("batch has ", batch.fields.size(), " fields, expected ",
                                                   signature.fields.size(), " (", absl::StrJoin(names, ", "), ")"));
  }
  if (frame_references && static_cast<int64_t>(batch.frames.size()) != rows * signature.num_frames) {
    return absl::InvalidArgumentError(absl::StrCat("batch has ", batch.frames.size(), " frame references, expected ",
                                                   rows * signature.num_frames, " (", rows, " rows of ",
                                                   signature.num_frames, " frames)"));
  }
  for (size_t f = 0; f < signature.fields.size(); ++f) {
    const FieldSpec& spec = signature.fields[f];
    const SampledField& field = batch.fields[f];
    if (field.dtype != spec.dtype || !HasBatchShape(spec, rows, field.shape) ||
        static_cast<int64_t>(field.data.size()) < BatchBytes(spec, rows, frame_references)) {
      std::vector<int64_t> expected;
      BatchShape(spec, rows, &expected);
      return absl::InvalidArgumentError(absl::StrCat(
          "batch field ", f, " (", spec.name, "): got ",
          ShapeString(field.dtype, field.shape.data(), static_cast<int>(field.shape.size())), " with ",
          field.data.size(), " bytes, expected ",
          ShapeString(spec.dtype, expected.data(), static_cast<int>(expected.size()))));
    }
  }
  return absl::OkStatus();
}

void ComputeWeights(const std::vector<SampledItem>& items, int64_t table_size, bool prioritized, double beta,
                    float* weights) {
  const size_t n = items.size();
  if (!prioritized || beta <= 0) {
    std::fill(weights, weights + n, 1.0f);
    return;
  }
  float max_weight = 0;
  for (size_t i = 0; i < n; ++i) {
    weights[i] = static_cast<float>(std::pow(static_cast<double>(table_size) * items[i].probability, -beta));
    max_weight = std::max(max_weight, weights[i]);
  }
  if (max_weight > 0) {
    for (size_t i = 0; i < n; ++i) weights[i] /= max_weight;
  }
}

namespace {

// A batch's keys, probabilities and importance weights.
void FillKeys(const std::vector<SampledItem>& items, int64_t table_size, bool prioritized, double beta,
              SampledBatch* batch) {
  const int64_t n = static_cast<int64_t>(items.size());
  TROUPE_CHECK(static_cast<int64_t>(batch->keys.size()) == n);
  batch->table_size = table_size;
  for (int64_t i = 0; i < n; ++i) {
    batch->keys[i] = items[i].item->key;
    batch->probabilities[i] = items[i].probability;
  }
  ComputeWeights(items, table_size, prioritized, beta, batch->weights.data());
}

}  // namespace

void FillBatchReferences(const Signature& signature, const std::vector<SampledItem>& items, int64_t table_size,
                         bool prioritized, double beta, SampledBatch* batch) {
  const int64_t n = static_cast<int64_t>(items.size());
  TROUPE_CHECK(batch->fields.size() == signature.fields.size() &&
               static_cast<int64_t>(batch->frames.size()) == n * signature.num_frames);
  FillKeys(items, table_size, prioritized, beta, batch);
  // Dense fields copied; an item's frames (already in signature order) referenced.
  for (int64_t i = 0; i < n; ++i) {
    const Item& item = *items[i].item;
    for (size_t f = 0; f < signature.fields.size(); ++f) {
      const FieldSpec& spec = signature.fields[f];
      if (spec.frames == 0) std::memcpy(batch->fields[f].data.data() + i * spec.bytes, item.dense.data() + spec.offset, spec.bytes);
    }
    std::copy(item.frames.begin(), item.frames.end(), batch->frames.begin() + i * signature.num_frames);
  }
}

absl::Status FillBatch(const Signature& signature, const std::vector<SampledItem>& items, int64_t table_size,
                       bool prioritized, double beta, FrameDecoder& decoder, SampledBatch* batch) {
  const int64_t n = static_cast<int64_t>(items.size());
  TROUPE_CHECK(static_cast<int64_t>(batch->keys.size()) == n && batch->fields.size() == signature.fields.size());
  FillKeys(items, table_size, prioritized, beta, batch);
  // Fields, item by item; each distinct frame (and reference) of the batch
  // is decoded once, repeats are copied.
  decoder.BeginBatch();
  for (int64_t i = 0; i < n; ++i) {
    const Item& item = *items[i].item;
    for (size_t f = 0; f < signature.fields.size(); ++f) {
      const FieldSpec& spec = signature.fields[f];
      uint8_t* base = batch->fields[f].data.data();
      if (spec.frames == 0) {
        std::memcpy(base + i * spec.bytes, item.dense.data() + spec.offset, spec.bytes);
        continue;
      }
      for (int32_t j = 0; j < spec.frames; ++j) {
        RETURN_IF_ERROR(decoder.DecodeInBatch(*item.frames[spec.offset + j], base + (i * spec.frames + j) * spec.bytes));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateReplayConfig(const config::ReplayConfig& config, bool tables_required) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat("replay.", parts...)); };
  RETURN_IF_ERROR(ValidateHostPort(config.listen(), "replay.listen"));
  if (config.max_message_bytes() < 1024 || config.max_message_bytes() > kMaxMessageBytes) {
    return bad("max_message_bytes ", config.max_message_bytes(), ": must be in [1024, ", kMaxMessageBytes, "]");
  }
  if (config.worker_threads() < 1 || config.worker_threads() > kMaxWorkerThreads) {
    return bad("worker_threads ", config.worker_threads(), ": must be in [1, ", kMaxWorkerThreads, "]");
  }
  if (config.frame_compression_level() < 1 || config.frame_compression_level() > 19) {
    return bad("frame_compression_level ", config.frame_compression_level(), ": must be in [1, 19]");
  }
  std::error_code ec;
  if (!config.checkpoint_dir().empty() && !std::filesystem::is_directory(config.checkpoint_dir(), ec)) {
    return absl::NotFoundError(absl::StrCat("replay.checkpoint_dir \"", absl::CHexEscape(config.checkpoint_dir()),
                                            "\": not an existing directory; create it first"));
  }
  if (!config.restore_path().empty() && !std::filesystem::is_regular_file(config.restore_path(), ec)) {
    return absl::NotFoundError(absl::StrCat("replay.restore_path \"", absl::CHexEscape(config.restore_path()),
                                            "\": not an existing regular file (a replay checkpoint)"));
  }
  if (tables_required && config.tables_size() == 0) return bad("tables: none; a replay needs at least one table");
  if (config.tables_size() > kMaxTables) return bad("tables: ", config.tables_size(), ", at most ", kMaxTables);
  absl::flat_hash_set<std::string> names;
  for (int i = 0; i < config.tables_size(); ++i) {
    const std::string prefix = absl::StrCat("replay.tables[", i, "].");
    RETURN_IF_ERROR(ValidateTableConfig(config.tables(i), prefix));
    if (!names.insert(config.tables(i).name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "name '", config.tables(i).name(), "': another table has this name"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Replay>> Replay::Create(const config::ReplayConfig& config) {
  // Check the whole config before creating anything.
  RETURN_IF_ERROR(ValidateReplayConfig(config));
  auto replay = std::unique_ptr<Replay>(new Replay(config));
  for (const auto& table_config : config.tables()) {
    ASSIGN_OR_RETURN(auto table, Table::Create(table_config));
    replay->tables_.push_back(std::move(table));
  }
  if (!config.restore_path().empty()) {
    auto restored = replay->Restore(config.restore_path());
    if (!restored.ok()) return restored.status();
  }
  return replay;
}

Replay::~Replay() { Close(); }

absl::StatusOr<Table*> Replay::FindTable(const std::string& name) const {
  for (const auto& table : tables_) {
    if (table->name() == name) return table.get();
  }
  std::vector<std::string> names;
  for (const auto& table : tables_) names.push_back(table->name());
  return absl::NotFoundError(absl::StrCat("unknown table '", name, "'; tables: ", absl::StrJoin(names, ", ")));
}

proto::InfoResponse Replay::Info() const {
  proto::InfoResponse info;
  for (const auto& table : tables_) *info.add_tables() = table->Info();
  info.set_frames(frame_store_.live_frames());
  info.set_frame_bytes(frame_store_.live_bytes());
  return info;
}

absl::StatusOr<int64_t> Replay::MutatePriorities(const proto::MutatePrioritiesRequest& request) {
  ASSIGN_OR_RETURN(Table * table, FindTable(request.table()));
  return table->MutatePriorities(std::span<const uint64_t>(request.keys().data(), request.keys_size()),
                                 std::span<const double>(request.priorities().data(), request.priorities_size()));
}

absl::StatusOr<int64_t> Replay::Checkpoint(const std::string& path, uint32_t* file_crc32) {
  std::vector<const Table*> tables;
  for (const auto& table : tables_) tables.push_back(table.get());
  return WriteCheckpoint(tables, path, file_crc32);
}

absl::StatusOr<int64_t> Replay::Restore(const std::string& path) {
  // Read and check the whole file before touching any table.
  ASSIGN_OR_RETURN(std::vector<RestoredTable> restored, ReadCheckpoint(path, frame_store_));
  std::vector<std::pair<Table*, TableSnapshot*>> plan;
  for (RestoredTable& r : restored) {
    auto table = FindTable(r.config.name());
    if (!table.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": ", table.status().message()));
    }
    ASSIGN_OR_RETURN(Signature signature, Signature::FromConfig(r.config));
    if (!signature.SameAs((*table)->signature())) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": table '", r.config.name(),
                                                        "' has a different signature in the checkpoint"));
    }
    if (static_cast<int64_t>(r.snapshot.items.size()) > (*table)->config().max_size()) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": table '", r.config.name(), "' holds ",
                                                        r.snapshot.items.size(), " items, max_size is ",
                                                        (*table)->config().max_size()));
    }
    plan.emplace_back(*table, &r.snapshot);
  }
  // Swap the contents in.
  int64_t items = 0;
  for (auto& [table, snapshot] : plan) {
    items += static_cast<int64_t>(snapshot->items.size());
    RETURN_IF_ERROR(table->Restore(std::move(*snapshot)));
  }
  return items;
}

namespace {

// DIR/NAME for a client's checkpoint name, or why not.
absl::StatusOr<std::string> CheckpointPathForName(const config::ReplayConfig& config, absl::string_view name) {
  if (config.checkpoint_dir().empty()) {
    return absl::FailedPreconditionError(
        "this replay server takes no checkpoints by name: it was started without a checkpoint directory "
        "(replay.checkpoint_dir, or `troupe replay --checkpoint-dir DIR`)");
  }
  RETURN_IF_ERROR(ValidateCheckpointName(name));
  return absl::StrCat(config.checkpoint_dir(), "/", name);
}

// `status` with the server's path of a checkpoint replaced by its name.
absl::Status NamedOnly(const absl::Status& status, const std::string& path, absl::string_view name) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrReplaceAll(status.message(), {{path, name}}));
}

}  // namespace

absl::StatusOr<int64_t> Replay::CheckpointByName(absl::string_view name) {
  ASSIGN_OR_RETURN(const std::string path, CheckpointPathForName(config_, name));
  absl::StatusOr<int64_t> bytes = Checkpoint(path);
  if (!bytes.ok()) return NamedOnly(bytes.status(), path, name);
  return bytes;
}

absl::StatusOr<int64_t> Replay::RestoreByName(absl::string_view name) {
  ASSIGN_OR_RETURN(const std::string path, CheckpointPathForName(config_, name));
  // Only a regular file of the directory itself: a link there could point
  // anywhere.
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", name, ": no such checkpoint"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", name, " is not a regular file"));
  }
  absl::StatusOr<int64_t> items = Restore(path);
  if (!items.ok()) return NamedOnly(items.status(), path, name);
  return items;
}

void Replay::Close() {
  for (const auto& table : tables_) table->Close();
}

void Replay::StopLimitingInserts() {
  for (const auto& table : tables_) table->StopLimitingInserts();
}

InsertSession::InsertSession(Replay* replay)
    : replay_(replay), compressor_(replay->config().frame_compression_level()) {}

absl::Status InsertSession::Prepare(proto::InsertRequest* request) {
  TROUPE_CHECK(!has_pending());
  DropPending();
  // A writer session's re-sent request: what already arrived is skipped.
  const bool session = request->writer() != 0;
  if (session && (request->sequence() < 1 || request->first_item() < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("writer session request: sequence ", request->sequence(),
                                                   " and first_item ", request->first_item(),
                                                   " must be >= 1 and >= 0"));
  }
  const bool resent = session && request->sequence() <= last_sequence_;
  int64_t skip = session ? std::max<int64_t>(0, items_inserted_ - request->first_item()) : 0;
  // Frames: keys strictly increasing over the stream; a reference must be held.
  for (int i = 0; i < request->frames_size(); ++i) {
    proto::FrameData* frame = request->mutable_frames(i);
    if (resent && any_frame_ && frame->key() <= last_frame_key_) continue;  // held since the first time
    if (any_frame_ && frame->key() <= last_frame_key_) {
      return absl::InvalidArgumentError(absl::StrCat("frame ", i, " of the request: key ", frame->key(),
                                                     " is not above the previous key ", last_frame_key_));
    }
    FramePtr reference;
    if (frame->has_reference_key()) {
      auto it = frames_.find(frame->reference_key());
      if (it == frames_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("frame key ", frame->key(), ": reference frame key ",
                                                       frame->reference_key(),
                                                       " was not sent on this stream (or was forgotten)"));
      }
      reference = it->second;
    }
    ASSIGN_OR_RETURN(FramePtr stored, replay_->frame_store().FromTensor(frame->mutable_pixels(), compressor_, decoder_,
                                                                        std::move(reference),
                                                                        absl::StrCat("frame key ", frame->key())));
    frames_.emplace_hint(frames_.end(), frame->key(), std::move(stored));
    any_frame_ = true;
    last_frame_key_ = frame->key();
  }
  if (session) last_sequence_ = std::max(last_sequence_, request->sequence());
  // Items, then item groups: check all before queueing any (but those a
  // re-send skips).
  const int64_t skipped = skip;
  const int64_t direct_skip = std::min<int64_t>(skip, request->items_size());
  pending_.resize(request->items_size() - direct_skip);
  for (int i = static_cast<int>(direct_skip); i < request->items_size(); ++i) {
    if (absl::Status status = PrepareItem(request->items(i), i, &pending_[i - direct_skip]); !status.ok()) {
      pending_.clear();
      return status;
    }
  }
  skip -= direct_skip;
  int first = request->items_size();
  for (const proto::ItemGroup& group : request->item_groups()) {
    const int64_t group_skip = std::min<int64_t>(skip, group.priorities_size());
    if (absl::Status status = PrepareGroup(group, first, group_skip); !status.ok()) {
      pending_.clear();
      return status;
    }
    skip -= group_skip;
    first += group.priorities_size();
  }
  items_skipped_ += skipped - skip;
  // Forget frames no later item may use (items keep their references).
  if (request->forget_frames_before() > 0) {
    frames_.erase(frames_.begin(), frames_.lower_bound(request->forget_frames_before()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Table*> InsertSession::ItemTable(const std::string& name, int index) {
  // The previous item's, usually.
  if (last_table_ == nullptr || last_table_->name() != name) {
    auto found = replay_->FindTable(name);
    if (!found.ok()) return absl::NotFoundError(absl::StrCat("item ", index, ": ", found.status().message()));
    last_table_ = *found;
  }
  return last_table_;
}

absl::StatusOr<FramePtr> InsertSession::ItemFrame(uint64_t key, const FieldSpec& spec,
                                                  absl::FunctionRef<std::string()> at) const {
  auto it = frames_.find(key);
  if (it == frames_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(at(), ": frame key ", key, " was not sent on this stream (or was forgotten)"));
  }
  const Frame& frame = *it->second;
  if (frame.height() != spec.shape[0] || frame.width() != spec.shape[1] || frame.channels() != spec.shape[2]) {
    const int64_t got[3] = {frame.height(), frame.width(), frame.channels()};
    return absl::InvalidArgumentError(absl::StrCat(at(), ": frame key ", key, " is ",
                                                   ShapeString(proto::DTYPE_UINT8, got, 3), ", expected ",
                                                   ShapeString(spec.dtype, spec.shape.data(), 3)));
  }
  return it->second;
}

absl::Status InsertSession::PrepareGroup(const proto::ItemGroup& group, int first, int64_t skip) {
  ASSIGN_OR_RETURN(Table * table, ItemTable(group.table(), first));
  const Signature& signature = table->signature();
  const int64_t n = group.priorities_size();
  // Error messages are built only on the error path.
  auto where = [&] { return absl::StrCat("item ", first, " (table '", group.table(), "')"); };
  // The layout, once for all its items: as ItemData items are checked.
  if (group.fields_size() != static_cast<int>(signature.fields.size())) {
    std::vector<std::string> names;
    for (const auto& f : signature.fields) names.push_back(f.name);
    return absl::InvalidArgumentError(absl::StrCat(where(), ": has ", group.fields_size(), " fields, the table has ",
                                                   signature.fields.size(), " (", absl::StrJoin(names, ", "), ")"));
  }
  for (size_t f = 0; f < signature.fields.size(); ++f) {
    const FieldSpec& spec = signature.fields[f];
    const proto::FieldLayout& layout = group.fields(f);
    auto at = [&] { return absl::StrCat(where(), " field '", spec.name, "'"); };
    if (spec.frames == 0) {
      const bool same_shape =
          std::equal(spec.shape.begin(), spec.shape.end(), layout.shape().begin(), layout.shape().end());
      if (layout.frames() != 0 || layout.dtype() != spec.dtype || !same_shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            at(), ": expected ", ShapeString(spec.dtype, spec.shape.data(), spec.shape.size()), ", got ",
            layout.frames() != 0 ? absl::StrCat(layout.frames(), " frame keys")
                                 : ShapeString(layout.dtype(), layout.shape().data(), layout.shape_size())));
      }
    } else if (layout.frames() != spec.frames) {
      return absl::InvalidArgumentError(
          absl::StrCat(at(), ": expected ", spec.frames, " frame keys, got ", layout.frames()));
    }
  }
  if (static_cast<int64_t>(group.dense().size()) != n * signature.dense_bytes ||
      group.frame_keys_size() != n * signature.num_frames) {
    return absl::InvalidArgumentError(absl::StrCat(
        "items ", first, "..", first + n - 1, " (table '", group.table(), "'): ", group.dense().size(),
        " dense bytes and ", group.frame_keys_size(), " frame keys, expected ", n * signature.dense_bytes, " and ",
        n * signature.num_frames));
  }
  // The items.
  pending_.reserve(pending_.size() + n - skip);
  for (int64_t i = skip; i < n; ++i) {
    const double priority = group.priorities(i);
    if (!std::isfinite(priority) || priority < 0) {
      return absl::InvalidArgumentError(absl::StrCat("item ", first + i, " (table '", group.table(), "'): priority ",
                                                     priority, " must be finite and >= 0"));
    }
    auto item = std::make_shared<Item>();
    item->dense.assign(group.dense().data() + i * signature.dense_bytes,
                       group.dense().data() + (i + 1) * signature.dense_bytes);
    item->frames.resize(signature.num_frames);
    const uint64_t* keys = group.frame_keys().data() + i * signature.num_frames;
    for (const FieldSpec& spec : signature.fields) {
      for (int32_t j = 0; j < spec.frames; ++j) {
        auto at = [&] { return absl::StrCat("item ", first + i, " (table '", group.table(), "') field '", spec.name, "'"); };
        ASSIGN_OR_RETURN(item->frames[spec.offset + j], ItemFrame(keys[spec.offset + j], spec, at));
      }
    }
    pending_.push_back(Pending{table, std::move(item), priority});
  }
  return absl::OkStatus();
}

absl::Status InsertSession::PrepareItem(const proto::ItemData& data, int index, Pending* out) {
  ASSIGN_OR_RETURN(Table * table, ItemTable(data.table(), index));
  const Signature& signature = table->signature();
  // Error messages are built only on the error path.
  auto where = [&] { return absl::StrCat("item ", index, " (table '", data.table(), "')"); };
  if (data.fields_size() != static_cast<int>(signature.fields.size())) {
    std::vector<std::string> names;
    for (const auto& f : signature.fields) names.push_back(f.name);
    return absl::InvalidArgumentError(absl::StrCat(where(), ": has ", data.fields_size(), " fields, the table has ",
                                                   signature.fields.size(), " (", absl::StrJoin(names, ", "), ")"));
  }
  if (!std::isfinite(data.priority()) || data.priority() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where(), ": priority ", data.priority(), " must be finite and >= 0"));
  }
  auto item = std::make_shared<Item>();
  item->dense.resize(signature.dense_bytes);
  item->frames.resize(signature.num_frames);
  for (size_t f = 0; f < signature.fields.size(); ++f) {
    const FieldSpec& spec = signature.fields[f];
    const proto::FieldData& field = data.fields(f);
    auto at = [&] { return absl::StrCat(where(), " field '", spec.name, "'"); };
    if (spec.frames == 0) {
      // Dense: exact dtype, shape and byte count, uncompressed.
      const proto::Tensor& t = field.tensor();
      const bool same_shape = std::equal(spec.shape.begin(), spec.shape.end(), t.shape().begin(), t.shape().end());
      if (t.dtype() != spec.dtype || !same_shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            at(), ": expected ", ShapeString(spec.dtype, spec.shape.data(), spec.shape.size()), ", got ",
            ShapeString(t.dtype(), t.shape().data(), t.shape_size())));
      }
      if (t.compression() != proto::COMPRESSION_NONE || static_cast<int64_t>(t.data().size()) != spec.bytes) {
        return absl::InvalidArgumentError(absl::StrCat(at(), ": expected ", spec.bytes, " uncompressed bytes, got ",
                                                       t.data().size(),
                                                       t.compression() != proto::COMPRESSION_NONE ? " compressed" : ""));
      }
      std::memcpy(item->dense.data() + spec.offset, t.data().data(), spec.bytes);
      continue;
    }
    // Pixel: exactly `frames` keys of frames this stream holds, of the field's shape.
    if (field.frame_keys_size() != spec.frames) {
      return absl::InvalidArgumentError(
          absl::StrCat(at(), ": expected ", spec.frames, " frame keys, got ", field.frame_keys_size()));
    }
    for (int j = 0; j < spec.frames; ++j) {
      ASSIGN_OR_RETURN(item->frames[spec.offset + j], ItemFrame(field.frame_keys(j), spec, at));
    }
  }
  *out = Pending{table, std::move(item), data.priority()};
  return absl::OkStatus();
}

absl::Duration InsertSession::pending_timeout() const {
  TROUPE_CHECK(has_pending());
  const int64_t ms = pending_[next_pending_].table->config().rate_limiter().insert_timeout_ms();
  return ms > 0 ? absl::Milliseconds(ms) : absl::InfiniteDuration();
}

absl::Status InsertSession::InsertPending(absl::Duration timeout) {
  while (next_pending_ < pending_.size()) {
    Pending& p = pending_[next_pending_];
    RETURN_IF_ERROR(p.table->Insert(p.item, p.priority, std::min(timeout, pending_timeout())));
    p.item.reset();
    ++next_pending_;
    ++items_inserted_;
  }
  pending_.clear();
  next_pending_ = 0;
  return absl::OkStatus();
}

}  // namespace troupe::replay
