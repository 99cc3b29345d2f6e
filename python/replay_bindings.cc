// troupe._native's replay half: a ReplayClient over gRPC (Writer, Sampler,
// Info, MutatePriorities) and a standalone replay::Server to embed in a
// Python process. Python's troupe.replay (python/troupe/replay.py) turns
// the field lists below into dicts by the table's signature.
//
// The GIL is released during every call that may block (network, rate
// limiter). Sampled fields are handed to numpy without a copy: each
// field's bytes are moved out of the batch into the array's owner.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/grpc_security.h"
#include "proto/config.pb.h"
#include "python/bindings.h"
#include "python/status.h"
#include "replay/client.h"
#include "replay/grpc_client.h"
#include "replay/server.h"

namespace troupe::python {
namespace py = pybind11;
namespace {

// `text` into `message`: JSON when it starts with '{' (what the Python side
// sends for a dict), else protobuf text format. InvalidArgument naming
// `what` and the parser's complaint.
absl::Status ParseMessage(const std::string& text, const std::string& what, google::protobuf::Message* message) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    const auto status = google::protobuf::util::JsonStringToMessage(text, message);
    if (!status.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", status.ToString()));
    return absl::OkStatus();
  }
  return ParseTextConfig(text, what, message);
}

// The credentials of a SecurityConfig (JSON or text) plus an explicit token
// (empty: $TROUPE_TOKEN or the config's token_file, as the C++ tools do).
absl::StatusOr<GrpcCredentials> Credentials(const std::string& security, const std::string& token) {
  config::SecurityConfig config;
  if (absl::Status parsed = ParseMessage(security, "security", &config); !parsed.ok()) return parsed;
  absl::StatusOr<GrpcCredentials> credentials = LoadGrpcCredentials(config);
  if (!credentials.ok()) return credentials.status();
  if (!token.empty()) {
    if (token.size() < kMinTokenLength) {
      return absl::InvalidArgumentError(
          absl::StrCat("token: ", token.size(), " characters; a token has at least ", kMinTokenLength));
    }
    credentials->token = token;
  }
  return credentials;
}

absl::StatusOr<proto::DType> DTypeOf(const py::dtype& dtype) {
  if (dtype.is(py::dtype::of<float>())) return proto::DTYPE_FLOAT32;
  if (dtype.is(py::dtype::of<double>())) return proto::DTYPE_FLOAT64;
  if (dtype.is(py::dtype::of<int32_t>())) return proto::DTYPE_INT32;
  if (dtype.is(py::dtype::of<int64_t>())) return proto::DTYPE_INT64;
  if (dtype.is(py::dtype::of<uint8_t>())) return proto::DTYPE_UINT8;
  return absl::InvalidArgumentError(absl::StrCat("dtype ", dtype.attr("name").cast<std::string>(),
                                                 " is not one replay stores (float32, float64, int32, int64, uint8)"));
}

py::dtype NumpyDType(proto::DType dtype) {
  switch (dtype) {
    case proto::DTYPE_FLOAT32: return py::dtype::of<float>();
    case proto::DTYPE_FLOAT64: return py::dtype::of<double>();
    case proto::DTYPE_INT32: return py::dtype::of<int32_t>();
    case proto::DTYPE_INT64: return py::dtype::of<int64_t>();
    default: return py::dtype::of<uint8_t>();
  }
}

// A vector's bytes as a numpy array of `shape`, without a copy: the vector
// moves into the capsule that owns the array's memory.
template <typename T>
py::array Adopt(std::vector<T>&& values, const py::dtype& dtype, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<T>(std::move(values));
  py::capsule owner(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array(dtype, std::move(shape), {}, owned->data(), owner);
}

class PyWriter {
 public:
  explicit PyWriter(std::unique_ptr<replay::Writer> writer) : writer_(std::move(writer)) {}

  uint64_t AppendFrame(const py::array_t<uint8_t, py::array::c_style | py::array::forcecast>& pixels) {
    if (pixels.ndim() != 3) {
      ThrowInvalidArgument(absl::StrCat("append_frame: a frame is uint8 [height, width, channels]; got ",
                                        pixels.ndim(), " dimensions"));
    }
    absl::StatusOr<uint64_t> key;
    {
      py::gil_scoped_release release;
      key = Open().AppendFrame(pixels.data(), int(pixels.shape(0)), int(pixels.shape(1)), int(pixels.shape(2)));
    }
    return ValueOrThrow(std::move(key));
  }

  // `fields` in the table's signature order: a numpy array (dense) or a
  // sequence of frame keys (a pixel field).
  void Insert(const std::string& table, double priority, const py::list& fields) {
    std::vector<py::array> arrays;  // keep dense data alive during Insert
    std::vector<replay::FieldValue> values;
    arrays.reserve(fields.size());
    for (const py::handle field : fields) {
      if (py::isinstance<py::array>(field)) {
        py::array array = py::array::ensure(field, py::array::c_style);
        const proto::DType dtype = ValueOrThrow(DTypeOf(array.dtype()));
        std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
        values.push_back(replay::FieldValue::Dense(dtype, shape, array.data()));
        arrays.push_back(std::move(array));
      } else {
        values.push_back(replay::FieldValue::Frames(field.cast<std::vector<uint64_t>>()));
      }
    }
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = Open().Insert(table, priority, values);
    }
    ThrowIfError(status);
  }

  void Flush() { Call([](replay::Writer& w) { return w.Flush(); }); }
  void Close() {
    if (writer_ == nullptr) return;
    Call([](replay::Writer& w) { return w.Close(); });
    writer_.reset();
  }
  int64_t items_sent() const { return writer_ ? writer_->items_sent() : 0; }
  int64_t bytes_sent() const { return writer_ ? writer_->bytes_sent() : 0; }

 private:
  replay::Writer& Open() {
    if (writer_ == nullptr) throw std::runtime_error("troupe replay writer: used after close()");
    return *writer_;
  }
  template <typename F>
  void Call(F&& f) {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = f(Open());
    }
    ThrowIfError(status);
  }

  std::unique_ptr<replay::Writer> writer_;
};

class PySampler {
 public:
  explicit PySampler(std::unique_ptr<replay::Sampler> sampler) : sampler_(std::move(sampler)) {}

  // (keys uint64 [B], probabilities float64 [B], weights float32 [B],
  // table_size, [field arrays in signature order]).
  py::tuple Next() {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = sampler_->Next(&batch_);
    }
    ThrowIfError(status);
    const py::ssize_t rows = py::ssize_t(batch_.keys.size());
    py::list fields;
    for (replay::SampledField& field : batch_.fields) {
      std::vector<py::ssize_t> shape(field.shape.begin(), field.shape.end());
      fields.append(Adopt(std::move(field.data), NumpyDType(field.dtype), std::move(shape)));
    }
    return py::make_tuple(Adopt(std::move(batch_.keys), py::dtype::of<uint64_t>(), {rows}),
                          Adopt(std::move(batch_.probabilities), py::dtype::of<double>(), {rows}),
                          Adopt(std::move(batch_.weights), py::dtype::of<float>(), {rows}), batch_.table_size,
                          fields);
  }

 private:
  std::unique_ptr<replay::Sampler> sampler_;
  replay::SampledBatch batch_;
};

class PyClient {
 public:
  PyClient(const std::string& address, const std::string& security, const std::string& token,
           int64_t max_message_bytes) {
    replay::GrpcClientOptions options;
    options.credentials = ValueOrThrow(Credentials(security, token));
    options.max_message_bytes = max_message_bytes;
    client_ = replay::NewGrpcClient(address, options);
  }

  std::unique_ptr<PyWriter> NewWriter(const std::string& codec, int compression_level, int frame_window,
                                      int max_items_per_request, bool reference_frames) {
    replay::WriterOptions options;
    if (codec == "lz4") {
      options.codec = proto::COMPRESSION_LZ4;
    } else if (codec == "zstd") {
      options.codec = proto::COMPRESSION_ZSTD;
    } else {
      ThrowInvalidArgument(absl::StrCat("codec: '", codec, "' is neither 'lz4' nor 'zstd'"));
    }
    options.compression_level = compression_level;
    options.frame_window = frame_window;
    options.max_items_per_request = max_items_per_request;
    options.reference_frames = reference_frames;
    absl::StatusOr<std::unique_ptr<replay::Writer>> writer;
    {
      py::gil_scoped_release release;
      writer = client_->NewWriter(options);
    }
    return std::make_unique<PyWriter>(ValueOrThrow(std::move(writer)));
  }

  std::unique_ptr<PySampler> NewSampler(const std::string& table, int batch_size, double timeout_seconds) {
    replay::SamplerOptions options{.table = table, .batch_size = batch_size};
    if (timeout_seconds > 0) options.timeout = absl::Seconds(timeout_seconds);
    absl::StatusOr<std::unique_ptr<replay::Sampler>> sampler;
    {
      py::gil_scoped_release release;
      sampler = client_->NewSampler(options);
    }
    return std::make_unique<PySampler>(ValueOrThrow(std::move(sampler)));
  }

  // InfoResponse as JSON (field names as in proto/replay.proto).
  std::string Info() {
    absl::StatusOr<proto::InfoResponse> info;
    {
      py::gil_scoped_release release;
      info = client_->Info();
    }
    ThrowIfError(info.status());
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(*info, &json, options);
    return json;
  }

  int64_t MutatePriorities(const std::string& table, const std::vector<uint64_t>& keys,
                           const std::vector<double>& priorities) {
    proto::MutatePrioritiesRequest request;
    request.set_table(table);
    request.mutable_keys()->Add(keys.begin(), keys.end());
    request.mutable_priorities()->Add(priorities.begin(), priorities.end());
    absl::StatusOr<int64_t> missing;
    {
      py::gil_scoped_release release;
      missing = client_->MutatePriorities(request);
    }
    return ValueOrThrow(std::move(missing));
  }

  int64_t Checkpoint(const std::string& path) {
    absl::StatusOr<int64_t> bytes;
    {
      py::gil_scoped_release release;
      bytes = client_->Checkpoint(path);
    }
    return ValueOrThrow(std::move(bytes));
  }

  int64_t Restore(const std::string& path) {
    absl::StatusOr<int64_t> items;
    {
      py::gil_scoped_release release;
      items = client_->Restore(path);
    }
    return ValueOrThrow(std::move(items));
  }

 private:
  std::unique_ptr<replay::ReplayClient> client_;
};

class PyServer {
 public:
  PyServer(const std::string& config_text, const std::string& security, const std::string& token) {
    config::ReplayConfig config;
    ThrowIfError(ParseMessage(config_text, "replay config", &config));
    const GrpcCredentials credentials = ValueOrThrow(Credentials(security, token));
    absl::StatusOr<std::unique_ptr<replay::Server>> server;
    {
      py::gil_scoped_release release;
      server = replay::Server::Start(config, credentials);
    }
    server_ = ValueOrThrow(std::move(server));
  }
  ~PyServer() { Shutdown(); }

  const std::string& address() const { return server_->address(); }
  int port() const { return server_->port(); }
  void Shutdown() {
    if (server_ == nullptr) return;
    py::gil_scoped_release release;
    server_->Shutdown();
  }

 private:
  std::unique_ptr<replay::Server> server_;
};

}  // namespace

void BindReplay(py::module_& module) {
  py::class_<PyWriter>(module, "ReplayWriter")
      .def("append_frame", &PyWriter::AppendFrame, py::arg("pixels"))
      .def("insert", &PyWriter::Insert, py::arg("table"), py::arg("priority"), py::arg("fields"))
      .def("flush", &PyWriter::Flush)
      .def("close", &PyWriter::Close)
      .def_property_readonly("items_sent", &PyWriter::items_sent)
      .def_property_readonly("bytes_sent", &PyWriter::bytes_sent);

  py::class_<PySampler>(module, "ReplaySampler").def("next", &PySampler::Next);

  py::class_<PyClient>(module, "ReplayClient")
      .def(py::init<const std::string&, const std::string&, const std::string&, int64_t>(), py::arg("address"),
           py::arg("security"), py::arg("token"), py::arg("max_message_bytes"))
      .def("new_writer", &PyClient::NewWriter, py::arg("codec"), py::arg("compression_level"),
           py::arg("frame_window"), py::arg("max_items_per_request"), py::arg("reference_frames"))
      .def("new_sampler", &PyClient::NewSampler, py::arg("table"), py::arg("batch_size"), py::arg("timeout_seconds"))
      .def("info", &PyClient::Info)
      .def("mutate_priorities", &PyClient::MutatePriorities, py::arg("table"), py::arg("keys"), py::arg("priorities"))
      .def("checkpoint", &PyClient::Checkpoint, py::arg("path"))
      .def("restore", &PyClient::Restore, py::arg("path"));

  py::class_<PyServer>(module, "ReplayServer")
      .def(py::init<const std::string&, const std::string&, const std::string&>(), py::arg("config"),
           py::arg("security"), py::arg("token"))
      .def_property_readonly("address", &PyServer::address)
      .def_property_readonly("port", &PyServer::port)
      .def("shutdown", &PyServer::Shutdown);
}

}  // namespace troupe::python
