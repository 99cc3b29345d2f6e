#include "engine/pjrt/plugin.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cpu_time.h"

namespace troupe::pjrt {
namespace {

std::atomic<bool> count_plugin_cpu{false};
thread_local double plugin_cpu_seconds = 0;
thread_local int plugin_call_depth = 0;

// Counts a Client call's thread CPU time (CountPluginCpu), once where calls nest.
class PluginCall {
 public:
  PluginCall() {
    if (!count_plugin_cpu.load(std::memory_order_relaxed)) return;
    counted_ = true;
    if (plugin_call_depth++ == 0) began_ = ThreadCpuSeconds();
  }
  ~PluginCall() {
    if (counted_ && --plugin_call_depth == 0) plugin_cpu_seconds += ThreadCpuSeconds() - began_;
  }
  PluginCall(const PluginCall&) = delete;
  PluginCall& operator=(const PluginCall&) = delete;

 private:
  bool counted_ = false;
  double began_ = 0;
};

// Zero-initialised argument struct with its struct_size set.
template <typename Args>
Args Make() {
  Args args{};
  args.struct_size = sizeof(Args);
  return args;
}

absl::StatusCode CodeOf(capi::ErrorCode code) {
  // PJRT's codes are absl's (both follow google.rpc.Code).
  return code >= capi::kCancelled && code <= capi::kUnauthenticated ? static_cast<absl::StatusCode>(code)
                                                                    : absl::StatusCode::kUnknown;
}

void AppendVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

}  // namespace

std::string CompileOptions(int replicas) {
  std::string build;  // ExecutableBuildOptionsProto
  AppendVarint(build, (1 << 3) | 0);  // device_ordinal = -1: not fixed
  AppendVarint(build, static_cast<uint64_t>(int64_t{-1}));
  AppendVarint(build, (4 << 3) | 0);  // num_replicas
  AppendVarint(build, static_cast<uint64_t>(replicas));
  AppendVarint(build, (5 << 3) | 0);  // num_partitions = 1
  AppendVarint(build, 1);
  if (replicas > 1) {
    // device_assignment = 9: DeviceAssignmentProto {replica_count = 1,
    // computation_count = 2, computation_devices = 3 {replica_device_ids = 1
    // (packed)}}: replica r on device r.
    std::string ids;
    for (int r = 0; r < replicas; ++r) AppendVarint(ids, static_cast<uint64_t>(r));
    std::string computation;
    AppendVarint(computation, (1 << 3) | 2);
    AppendVarint(computation, ids.size());
    computation += ids;
    std::string assignment;
    AppendVarint(assignment, (1 << 3) | 0);
    AppendVarint(assignment, static_cast<uint64_t>(replicas));
    AppendVarint(assignment, (2 << 3) | 0);
    AppendVarint(assignment, 1);
    AppendVarint(assignment, (3 << 3) | 2);
    AppendVarint(assignment, computation.size());
    assignment += computation;
    AppendVarint(build, (9 << 3) | 2);
    AppendVarint(build, assignment.size());
    build += assignment;
  }
  std::string options;  // CompileOptionsProto
  AppendVarint(options, (3 << 3) | 2);  // executable_build_options
  AppendVarint(options, build.size());
  options += build;
  if (replicas == 1) {
    AppendVarint(options, (4 << 3) | 0);  // compile_portable_executable = true
    AppendVarint(options, 1);
  }
  return options;
}

absl::Status Plugin::ToStatus(capi::Error* error, std::string_view what) const {
  if (error == nullptr) return absl::OkStatus();
  auto message = Make<capi::ErrorMessageArgs>();
  message.error = error;
  api_->Error_Message(&message);
  auto code = Make<capi::ErrorGetCodeArgs>();
  code.error = error;
  code.code = capi::kUnknown;
  if (capi::Error* e = api_->Error_GetCode(&code); e != nullptr) {
    auto destroy = Make<capi::ErrorDestroyArgs>();
    destroy.error = e;
    api_->Error_Destroy(&destroy);
    code.code = capi::kUnknown;
  }
  absl::Status status(CodeOf(code.code), absl::StrCat("PJRT plugin ", path_, ": ", std::string(what), ": ",
                                                      std::string(message.message, message.message_size)));
  auto destroy = Make<capi::ErrorDestroyArgs>();
  destroy.error = error;
  api_->Error_Destroy(&destroy);
  return status;
}

absl::StatusOr<const Plugin*> Plugin::Load(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Plugin>>* loaded = new std::map<std::string, std::unique_ptr<Plugin>>;
  std::lock_guard lock(mu);
  if (auto it = loaded->find(path); it != loaded->end()) return it->second.get();

  struct stat st;
  if (path.empty() || stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("PJRT plugin '", path, "': no such file (engine.pjrt_plugin names the ",
                                            "plugin's .so: libtpu.so, the XLA CUDA or CPU plugin)"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("PJRT plugin '", path, "': not a regular file"));
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("PJRT plugin '", path, "': cannot load it: ", dlerror()));
  }
  auto get_api = reinterpret_cast<capi::GetPjrtApiFn>(dlsym(handle, capi::kGetPjrtApiSymbol));
  if (get_api == nullptr) {
    dlclose(handle);
    return absl::InvalidArgumentError(absl::StrCat("PJRT plugin '", path, "': no symbol ", capi::kGetPjrtApiSymbol,
                                                   ": not a PJRT plugin"));
  }
  const capi::Api* api = get_api();
  if (api == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("PJRT plugin '", path, "': ", capi::kGetPjrtApiSymbol,
                                                   " returned no function table"));
  }
  const auto& version = api->pjrt_api_version;
  if (version.major_version != capi::kSupportedMajor || version.minor_version < capi::kBaselineMinor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PJRT plugin '", path, "': API version ", version.major_version, ".", version.minor_version,
        " is not supported (troupe speaks ", capi::kSupportedMajor, ".", capi::kBaselineMinor, " and later 0.x)"));
  }
  if (api->struct_size < capi::kApiSizeNeeded) {
    return absl::InvalidArgumentError(absl::StrCat("PJRT plugin '", path, "': function table of ", api->struct_size,
                                                   " bytes, troupe calls entries up to byte ",
                                                   capi::kApiSizeNeeded));
  }
  auto plugin = std::unique_ptr<Plugin>(new Plugin(path, api));
  auto init = Make<capi::PluginInitializeArgs>();
  if (absl::Status s = plugin->ToStatus(api->Plugin_Initialize(&init), "initialising"); !s.ok()) return s;
  const Plugin* p = plugin.get();
  loaded->emplace(path, std::move(plugin));
  return p;
}

Client::Client(const Plugin* plugin, capi::Client* client)
    : plugin_(plugin), client_(client), compile_options_(CompileOptions()) {}

Client::~Client() {
  auto args = Make<capi::ClientDestroyArgs>();
  args.client = client_;
  (void)plugin_->ToStatus(plugin_->api().Client_Destroy(&args), "destroying the client");
}

namespace {

// A scalar create option named `name` (a literal), its value still to set.
capi::NamedValue NamedScalar(const char* name, capi::NamedValueType type) {
  auto v = Make<capi::NamedValue>();
  v.name = name;
  v.name_size = std::strlen(name);
  v.type = type;
  v.value_size = 1;
  return v;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Client>> Client::Shared(const std::string& plugin_path, const ClientOptions& options) {
  static std::mutex mu;
  static auto* clients = new std::map<std::string, std::weak_ptr<Client>>;
  if (!(options.memory_fraction >= 0 && options.memory_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PJRT client memory fraction ", options.memory_fraction, ": must be in [0, 1] (0 = on demand)"));
  }
  std::lock_guard lock(mu);
  if (auto it = clients->find(plugin_path); it != clients->end()) {
    if (auto client = it->second.lock()) return client;
  }
  absl::StatusOr<const Plugin*> plugin = Plugin::Load(plugin_path);
  if (!plugin.ok()) return plugin.status();
  const capi::Api& api = (*plugin)->api();
  // The GPU plugin's memory options; a plugin that knows none (XLA's CPU
  // plugin: "Unexpected option name") refuses them, and is asked again without.
  std::vector<capi::NamedValue> memory(1, NamedScalar("preallocate", capi::kNamedBool));
  memory[0].bool_value = options.memory_fraction > 0;
  if (options.memory_fraction > 0) {
    memory.push_back(NamedScalar("memory_fraction", capi::kNamedFloat));
    memory[1].float_value = options.memory_fraction;
  }
  auto create = Make<capi::ClientCreateArgs>();
  create.create_options = memory.data();
  create.num_options = memory.size();
  std::string memory_said = options.memory_fraction > 0
                                ? absl::StrCat(std::lround(100 * options.memory_fraction), "% of the GPU at start")
                                : "on demand";
  absl::Status created = (*plugin)->ToStatus(api.Client_Create(&create), "creating a client");
  if (!created.ok() && created.code() == absl::StatusCode::kInvalidArgument &&
      absl::StrContains(absl::AsciiStrToLower(created.message()), "option")) {
    create = Make<capi::ClientCreateArgs>();
    created = (*plugin)->ToStatus(api.Client_Create(&create), "creating a client");
    memory_said = "the plugin's default (it takes no memory options)";
  }
  if (!created.ok()) return created;
  std::shared_ptr<Client> client(new Client(*plugin, create.client));
  client->memory_ = memory_said;

  auto name = Make<capi::ClientPlatformNameArgs>();
  name.client = create.client;
  if (absl::Status s = (*plugin)->ToStatus(api.Client_PlatformName(&name), "platform name"); !s.ok()) return s;
  client->platform_.assign(name.platform_name, name.platform_name_size);
  auto devices = Make<capi::ClientAddressableDevicesArgs>();
  devices.client = create.client;
  if (absl::Status s = (*plugin)->ToStatus(api.Client_AddressableDevices(&devices), "devices"); !s.ok()) return s;
  client->devices_.assign(devices.addressable_devices, devices.addressable_devices + devices.num_addressable_devices);
  if (client->devices_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("PJRT plugin ", plugin_path, ": no device (platform ",
                                                      client->platform_, ")"));
  }
  (*clients)[plugin_path] = client;
  return client;
}

std::string Client::device_kind(int device) const {
  if (!CheckDevice(device).ok()) return "?";
  const capi::Api& api = plugin_->api();
  auto description = Make<capi::DeviceGetDescriptionArgs>();
  description.device = devices_[device];
  if (!plugin_->ToStatus(api.Device_GetDescription(&description), "device description").ok()) return "?";
  auto kind = Make<capi::DeviceDescriptionKindArgs>();
  kind.device_description = description.device_description;
  if (!plugin_->ToStatus(api.DeviceDescription_Kind(&kind), "device kind").ok()) return "?";
  return std::string(kind.device_kind, kind.device_kind_size);
}

absl::Status Client::CheckDevice(int device) const {
  if (device < 0 || device >= num_devices()) {
    return absl::OutOfRangeError(absl::StrCat("PJRT plugin ", plugin_->path(), ": device ", device, " of ",
                                              num_devices(), " (platform ", platform_, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<capi::LoadedExecutable*> Client::Compile(std::string_view mlir, int replicas) {
  PluginCall counted;
  if (replicas < 1 || replicas > num_devices()) {
    return absl::OutOfRangeError(absl::StrCat("a program for ", replicas, " replicas: the plugin has ", num_devices(),
                                              " device(s) (", platform_, ")"));
  }
  const std::string replicated = replicas > 1 ? CompileOptions(replicas) : std::string();
  std::string code(mlir);
  static constexpr std::string_view kFormat = "mlir";
  auto program = Make<capi::Program>();
  program.code = code.data();
  program.code_size = code.size();
  program.format = kFormat.data();
  program.format_size = kFormat.size();
  auto args = Make<capi::ClientCompileArgs>();
  args.client = client_;
  args.program = &program;
  const std::string& options = replicas > 1 ? replicated : compile_options_;
  args.compile_options = options.data();
  args.compile_options_size = options.size();
  if (absl::Status s = plugin_->ToStatus(plugin_->api().Client_Compile(&args), "compiling"); !s.ok()) return s;
  return args.executable;
}

void Client::Destroy(capi::LoadedExecutable* executable) {
  PluginCall counted;
  if (executable == nullptr) return;
  auto args = Make<capi::LoadedExecutableDestroyArgs>();
  args.executable = executable;
  (void)plugin_->ToStatus(plugin_->api().LoadedExecutable_Destroy(&args), "destroying an executable");
}

absl::StatusOr<std::string> Client::Serialize(capi::LoadedExecutable* executable) {
  const capi::Api& api = plugin_->api();
  if (api.LoadedExecutable_GetExecutable == nullptr || api.Executable_Serialize == nullptr ||
      api.Executable_Destroy == nullptr) {
    return absl::UnimplementedError(absl::StrCat("PJRT plugin ", plugin_->path(), " cannot serialize programs"));
  }
  auto get = Make<capi::LoadedExecutableGetExecutableArgs>();
  get.loaded_executable = executable;
  if (absl::Status s = plugin_->ToStatus(api.LoadedExecutable_GetExecutable(&get), "getting an executable"); !s.ok()) {
    return s;
  }
  auto serialize = Make<capi::ExecutableSerializeArgs>();
  serialize.executable = get.executable;
  absl::Status s = plugin_->ToStatus(api.Executable_Serialize(&serialize), "serializing an executable");
  std::string bytes;
  if (s.ok()) bytes.assign(serialize.serialized_bytes, serialize.serialized_bytes_size);
  if (serialize.serialized_executable_deleter != nullptr && serialize.serialized_executable != nullptr) {
    serialize.serialized_executable_deleter(serialize.serialized_executable);
  }
  auto destroy = Make<capi::ExecutableDestroyArgs>();
  destroy.executable = get.executable;
  (void)plugin_->ToStatus(api.Executable_Destroy(&destroy), "destroying an executable");
  if (!s.ok()) return s;
  return bytes;
}

absl::StatusOr<capi::LoadedExecutable*> Client::Deserialize(std::string_view bytes) {
  const capi::Api& api = plugin_->api();
  if (api.Executable_DeserializeAndLoad == nullptr) {
    return absl::UnimplementedError(absl::StrCat("PJRT plugin ", plugin_->path(), " cannot load serialized programs"));
  }
  auto load = Make<capi::ExecutableDeserializeAndLoadArgs>();
  load.client = client_;
  load.serialized_executable = bytes.data();
  load.serialized_executable_size = bytes.size();
  if (absl::Status s = plugin_->ToStatus(api.Executable_DeserializeAndLoad(&load), "loading a serialized program");
      !s.ok()) {
    return s;
  }
  return load.loaded_executable;
}

namespace {

void DestroyEvent(const Plugin& plugin, capi::Event* event) {
  if (event == nullptr) return;
  auto destroy = Make<capi::EventDestroyArgs>();
  destroy.event = event;
  (void)plugin.ToStatus(plugin.api().Event_Destroy(&destroy), "destroying an event");
}

// Waits for `event` and destroys it; its error as a Status.
absl::Status AwaitEvent(const Plugin& plugin, capi::Event* event, std::string_view what) {
  if (event == nullptr) return absl::OkStatus();
  auto await = Make<capi::EventAwaitArgs>();
  await.event = event;
  absl::Status status = plugin.ToStatus(plugin.api().Event_Await(&await), what);
  DestroyEvent(plugin, event);
  return status;
}

}  // namespace

absl::StatusOr<capi::Buffer*> Client::BufferFromHost(const void* data, capi::BufferType type,
                                                     std::span<const int64_t> dims, int device) {
  PluginCall counted;
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  auto args = Make<capi::ClientBufferFromHostBufferArgs>();
  args.client = client_;
  args.data = data;
  args.type = type;
  args.dims = dims.data();
  args.num_dims = dims.size();
  args.host_buffer_semantics = capi::kImmutableOnlyDuringCall;
  args.device = devices_[device];
  if (absl::Status s = plugin_->ToStatus(plugin_->api().Client_BufferFromHostBuffer(&args), "copying to the device");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = AwaitEvent(*plugin_, args.done_with_host_buffer, "copying to the device"); !s.ok()) {
    Destroy(args.buffer);
    return s;
  }
  return args.buffer;
}

absl::Status Client::ToHost(capi::Buffer* buffer, void* host, size_t bytes) {
  PluginCall counted;
  auto args = Make<capi::BufferToHostBufferArgs>();
  args.src = buffer;
  args.dst = host;
  args.dst_size = bytes;
  if (absl::Status s = plugin_->ToStatus(plugin_->api().Buffer_ToHostBuffer(&args), "copying to the host"); !s.ok()) {
    return s;
  }
  return AwaitEvent(*plugin_, args.event, "copying to the host");
}

absl::Status Client::Await(capi::Buffer* buffer) {
  PluginCall counted;
  auto args = Make<capi::BufferReadyEventArgs>();
  args.buffer = buffer;
  if (absl::Status s = plugin_->ToStatus(plugin_->api().Buffer_ReadyEvent(&args), "waiting"); !s.ok()) return s;
  return AwaitEvent(*plugin_, args.event, "computing");
}

absl::StatusOr<capi::Event*> Client::WhenReady(capi::Buffer* buffer, std::function<void()> then) {
  PluginCall counted;
  auto ready = Make<capi::BufferReadyEventArgs>();
  ready.buffer = buffer;
  if (absl::Status s = plugin_->ToStatus(plugin_->api().Buffer_ReadyEvent(&ready), "waiting"); !s.ok()) return s;
  // The callback's own: freed by the callback, whenever it runs.
  struct Pending {
    const Plugin* plugin;
    std::function<void()> then;
  };
  auto on_ready = Make<capi::EventOnReadyArgs>();
  on_ready.event = ready.event;
  on_ready.user_arg = new Pending{plugin_, std::move(then)};
  on_ready.callback = [](capi::Error* error, void* arg) {
    std::unique_ptr<Pending> pending(static_cast<Pending*>(arg));
    (void)pending->plugin->ToStatus(error, "computing");  // destroys it: the reader of the buffer sees the error
    pending->then();
  };
  if (absl::Status s = plugin_->ToStatus(plugin_->api().Event_OnReady(&on_ready), "waiting"); !s.ok()) {
    delete static_cast<Pending*>(on_ready.user_arg);
    Destroy(ready.event);
    return s;
  }
  return ready.event;
}

void Client::Destroy(capi::Event* event) {
  PluginCall counted;
  DestroyEvent(*plugin_, event);
}

void Client::Destroy(capi::Buffer* buffer) {
  PluginCall counted;
  if (buffer == nullptr) return;
  auto args = Make<capi::BufferDestroyArgs>();
  args.buffer = buffer;
  (void)plugin_->ToStatus(plugin_->api().Buffer_Destroy(&args), "destroying a buffer");
}

absl::Status Client::Execute(capi::LoadedExecutable* executable, std::span<capi::Buffer* const> args,
                             std::span<capi::Buffer*> outputs, int device) {
  PluginCall counted;
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  auto options = Make<capi::ExecuteOptions>();
  capi::Buffer* const* argument_list = args.data();
  capi::Buffer** output_list = outputs.data();
  auto execute = Make<capi::LoadedExecutableExecuteArgs>();
  execute.executable = executable;
  execute.options = &options;
  execute.argument_lists = &argument_list;
  execute.num_devices = 1;
  execute.num_args = args.size();
  execute.output_lists = &output_list;
  execute.execute_device = devices_[device];
  return plugin_->ToStatus(plugin_->api().LoadedExecutable_Execute(&execute), "executing");
}

absl::Status Client::ExecuteReplicated(capi::LoadedExecutable* executable,
                                       const std::vector<std::vector<capi::Buffer*>>& args,
                                       std::vector<std::vector<capi::Buffer*>>& outputs) {
  PluginCall counted;
  if (args.size() != outputs.size() || args.empty()) {
    return absl::InvalidArgumentError("ExecuteReplicated: one argument list and one output list per replica");
  }
  auto options = Make<capi::ExecuteOptions>();
  std::vector<capi::Buffer* const*> argument_lists;
  std::vector<capi::Buffer**> output_lists;
  for (size_t r = 0; r < args.size(); ++r) {
    if (args[r].size() != args[0].size()) return absl::InvalidArgumentError("ExecuteReplicated: ragged argument lists");
    argument_lists.push_back(args[r].data());
    output_lists.push_back(outputs[r].data());
  }
  auto execute = Make<capi::LoadedExecutableExecuteArgs>();
  execute.executable = executable;
  execute.options = &options;
  execute.argument_lists = argument_lists.data();
  execute.num_devices = args.size();
  execute.num_args = args[0].size();
  execute.output_lists = output_lists.data();
  execute.execute_device = nullptr;  // the devices of the program's assignment, replica r on device r
  return plugin_->ToStatus(plugin_->api().LoadedExecutable_Execute(&execute), "executing on every replica");
}

void CountPluginCpu(bool on) { count_plugin_cpu.store(on, std::memory_order_relaxed); }

double PluginCpuSecondsOfThisThread() { return plugin_cpu_seconds; }

}  // namespace troupe::pjrt
