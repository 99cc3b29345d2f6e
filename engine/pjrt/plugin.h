// A PJRT plugin (libtpu.so, the XLA CUDA or CPU plugin) loaded with dlopen,
// and a client of it: devices, programs compiled from StableHLO text, device
// buffers, executions. Every PJRT error becomes an absl::Status carrying the
// plugin's own message and code.
//
//   auto client = pjrt::Client::Shared("/path/to/pjrt_c_api_cpu_plugin.so");
//   auto exe = (*client)->Compile(module_text);
//   auto buf = (*client)->BufferFromHost(data, capi::kF32, {4}, /*device=*/0);
//   (*client)->Execute(*exe, {*buf}, outputs, /*device=*/0);
//   (*client)->ToHost(outputs[0], host, 16);
#ifndef TROUPE_ENGINE_PJRT_PLUGIN_H_
#define TROUPE_ENGINE_PJRT_PLUGIN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/pjrt/pjrt_c_api.h"

namespace troupe::pjrt {

// A plugin library and its function table; loaded once per path per process
// (a plugin may not be initialised twice) and never unloaded.
class Plugin {
 public:
  // Errors: NotFound for a missing file; InvalidArgument for a file dlopen
  // refuses, one without GetPjrtApi, a function table too short for troupe's
  // calls, or an API version troupe does not support (major other than 0,
  // minor below the baseline); the plugin's own error from its initialisation.
  static absl::StatusOr<const Plugin*> Load(const std::string& path);

  const capi::Api& api() const { return *api_; }
  const std::string& path() const { return path_; }
  int major_version() const { return api_->pjrt_api_version.major_version; }
  int minor_version() const { return api_->pjrt_api_version.minor_version; }

  // `error` (which this destroys) as a Status: the plugin's code and message
  // after `what` troupe was doing. OK for null.
  absl::Status ToStatus(capi::Error* error, std::string_view what) const;

 private:
  Plugin(std::string path, const capi::Api* api) : path_(std::move(path)), api_(api) {}
  std::string path_;
  const capi::Api* api_;
};

// One client of a plugin: its devices and everything made on them. Shared by
// the backends of one process that name the same plugin (a client owns the
// devices; a second one could not open a GPU the first holds).
// How a client takes its device's memory (the XLA GPU plugin's create
// options; other plugins refuse them, and the client is made without).
struct ClientOptions {
  // 0: on demand (the allocator grows as buffers are made, so several
  // processes share a GPU); (0, 1]: that fraction of the GPU's memory at
  // start, as JAX does (XLA's default, 0.75, when the plugin takes no options).
  float memory_fraction = 0;
};

// The calling thread's CPU time inside a Client's calls into the plugin
// (copies, executions, reads, destroys), counted while turned on: what a
// benchmark splits the learner thread's host time by, the plugin's work (on
// the CPU plugin, its allocations and copies, and whatever of a program it
// runs on the caller) against troupe's own. Off by default (no clock read).
void CountPluginCpu(bool on);
double PluginCpuSecondsOfThisThread();

class Client {
 public:
  // The client of the plugin at `plugin_path`, made on the first call with
  // that call's `options` (later calls share it, whatever their options).
  static absl::StatusOr<std::shared_ptr<Client>> Shared(const std::string& plugin_path,
                                                        const ClientOptions& options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Plugin& plugin() const { return *plugin_; }
  // "cpu", "cuda", "tpu", ...
  const std::string& platform() const { return platform_; }
  // How it took memory: "on demand", "90% of the GPU at start", or "the
  // plugin's default (it takes no memory options)".
  const std::string& memory() const { return memory_; }
  int num_devices() const { return static_cast<int>(devices_.size()); }
  // The device's kind as the plugin names it ("cpu", "NVIDIA H100 80GB HBM3", "TPU v5 lite").
  std::string device_kind(int device) const;

  // A program in StableHLO (MLIR text), compiled for any of this client's
  // devices; with `replicas` > 1, for replicas 0..K-1 on devices 0..K-1
  // (one program, its collectives across them). Errors: the plugin's (a
  // parse or verification error quotes the text's line); OutOfRange for
  // more replicas than devices.
  absl::StatusOr<capi::LoadedExecutable*> Compile(std::string_view mlir, int replicas = 1);
  void Destroy(capi::LoadedExecutable* executable);
  // A compiled program as bytes the same plugin version loads again
  // (Unimplemented where the plugin cannot serialize), and back.
  absl::StatusOr<std::string> Serialize(capi::LoadedExecutable* executable);
  absl::StatusOr<capi::LoadedExecutable*> Deserialize(std::string_view bytes);

  // A dense row-major buffer on `device` with a copy of `data`.
  absl::StatusOr<capi::Buffer*> BufferFromHost(const void* data, capi::BufferType type, std::span<const int64_t> dims,
                                               int device);
  // Copies the buffer's `bytes` (all of it) to `host`, waiting for the kernels
  // that write it.
  absl::Status ToHost(capi::Buffer* buffer, void* host, size_t bytes);
  // Waits until the buffer's contents are computed; an execution's error shows here.
  absl::Status Await(capi::Buffer* buffer);
  // `then` runs (on one of the plugin's threads, or at once) when the
  // buffer's contents are computed, whether or not that failed. The event
  // returned is destroyed with Destroy once the buffer is known computed.
  absl::StatusOr<capi::Event*> WhenReady(capi::Buffer* buffer, std::function<void()> then);
  void Destroy(capi::Event* event);
  void Destroy(capi::Buffer* buffer);

  // Runs `executable` on `device` with `args`; `outputs` (sized to the
  // program's result count) receives new buffers. Arguments the program
  // aliases to an output are donated: their buffers are spent.
  absl::Status Execute(capi::LoadedExecutable* executable, std::span<capi::Buffer* const> args,
                       std::span<capi::Buffer*> outputs, int device);
  // Runs a program compiled for K replicas once on all of them: args[r] are
  // replica r's (on device r), outputs[r] (sized to the result count) gets
  // its results. Donation as Execute.
  absl::Status ExecuteReplicated(capi::LoadedExecutable* executable,
                                 const std::vector<std::vector<capi::Buffer*>>& args,
                                 std::vector<std::vector<capi::Buffer*>>& outputs);

 private:
  Client(const Plugin* plugin, capi::Client* client);
  absl::Status CheckDevice(int device) const;
  const Plugin* plugin_;
  capi::Client* client_;
  std::string platform_;
  std::string memory_;
  std::vector<capi::Device*> devices_;
  std::string compile_options_;
};

// A serialized xla.CompileOptionsProto: one replica, one partition, portable
// (the program runs on whichever device an execution names); or `replicas`
// replicas on devices 0..K-1 (not portable). Encoded here from the message's
// field numbers (executable_build_options = 3 with device_ordinal = 1,
// num_replicas = 4, num_partitions = 5, device_assignment = 9;
// compile_portable_executable = 4).
std::string CompileOptions(int replicas = 1);

}  // namespace troupe::pjrt

#endif  // TROUPE_ENGINE_PJRT_PLUGIN_H_
