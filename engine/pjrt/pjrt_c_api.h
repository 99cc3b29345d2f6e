// The part of the PJRT C API (OpenXLA's plugin interface, which libtpu.so,
// the XLA CUDA plugin and the XLA CPU plugin implement) that troupe calls,
// declared here so that troupe builds without OpenXLA's sources.
//
// Written from the API's documentation; the ABI rules it follows:
//  - A plugin exports `const PJRT_Api* GetPjrtApi()`: a table of function
//    pointers in a fixed order, headed by its own size and the API version the
//    plugin was built with (major 0 so far: any major change breaks the ABI;
//    minor versions only append fields and functions).
//  - Every argument struct starts with `struct_size` (the caller's size of the
//    struct, which tells the plugin which trailing fields the caller knows)
//    and `extension_start`. Plugins refuse a struct shorter than the one they
//    were built with, so the structs below are whole, as of API version
//    kBaselineMinor (0.81, which plugins up to 0.115 at least accept).
//  - A function returns null on success or a PJRT_Error the caller destroys.
//
// Only the fields troupe reads or writes are named; the table's other entries
// are kept as `Unused` placeholders so the named ones sit at their offsets.
// engine/pjrt/pjrt_c_api_layout_check.cc (built and run by
// tools/pjrt_layout_check.sh, ctest PjrtCApi.LayoutMatchesThePluginsHeader)
// checks every named offset against a plugin's own pjrt_c_api.h where one is
// at hand (the xla-cpu-pjrt wheel ships it), so a slip here fails a test
// instead of corrupting memory.
#ifndef TROUPE_ENGINE_PJRT_PJRT_C_API_H_
#define TROUPE_ENGINE_PJRT_PJRT_C_API_H_

#include <cstddef>
#include <cstdint>

namespace troupe::pjrt::capi {

// The API versions troupe's structs follow: major 0, minor 81 or later.
inline constexpr int kSupportedMajor = 0;
inline constexpr int kBaselineMinor = 81;

// Opaque handles owned by the plugin.
struct Error;
struct Client;
struct Device;
struct DeviceDescription;
struct Memory;
struct Event;
struct LoadedExecutable;
struct Buffer;
struct ExtensionBase;

enum ErrorCode : int {
  kOk = 0, kCancelled = 1, kUnknown = 2, kInvalidArgument = 3, kDeadlineExceeded = 4, kNotFound = 5,
  kAlreadyExists = 6, kPermissionDenied = 7, kResourceExhausted = 8, kFailedPrecondition = 9, kAborted = 10,
  kOutOfRange = 11, kUnimplemented = 12, kInternal = 13, kUnavailable = 14, kDataLoss = 15, kUnauthenticated = 16,
};

// PJRT_Buffer_Type: the element types troupe moves (the enum's order).
enum BufferType : int { kInvalid = 0, kPred = 1, kS8 = 2, kS16 = 3, kS32 = 4, kS64 = 5, kU8 = 6, kF32 = 11 };

// PJRT_HostBufferSemantics: troupe's host data is only read during the call.
enum HostBufferSemantics : int { kImmutableOnlyDuringCall = 0 };

struct ErrorDestroyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Error* error;
};
struct ErrorMessageArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const Error* error;
  const char* message;  // out
  size_t message_size;  // out
};
struct ErrorGetCodeArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const Error* error;
  ErrorCode code;  // out
};
struct PluginInitializeArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
};
struct EventDestroyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Event* event;
};
struct EventAwaitArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Event* event;
};
// Called once the event is ready, with its error (null on success), which
// the callback owns and destroys.
using EventOnReadyCallback = void (*)(Error* error, void* user_arg);
struct EventOnReadyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Event* event;
  EventOnReadyCallback callback;
  void* user_arg;
};
// PJRT_NamedValue: one create option (the XLA GPU plugin's "preallocate",
// "memory_fraction").
enum NamedValueType : int { kNamedString = 0, kNamedInt64 = 1, kNamedInt64List = 2, kNamedFloat = 3, kNamedBool = 4 };
struct NamedValue {
  size_t struct_size;
  ExtensionBase* extension_start;
  const char* name;
  size_t name_size;
  NamedValueType type;
  union {
    const char* string_value;
    int64_t int64_value;
    const int64_t* int64_array_value;
    float float_value;
    bool bool_value;
  };
  size_t value_size;  // 1 for a scalar
};
struct ClientCreateArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const NamedValue* create_options;
  size_t num_options;
  void* kv_get_callback;
  void* kv_get_user_arg;
  void* kv_put_callback;
  void* kv_put_user_arg;
  Client* client;  // out
  void* kv_try_get_callback;
  void* kv_try_get_user_arg;
};
struct ClientDestroyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
};
struct ClientPlatformNameArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
  const char* platform_name;  // out
  size_t platform_name_size;  // out
};
struct ClientAddressableDevicesArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
  Device* const* addressable_devices;  // out
  size_t num_addressable_devices;      // out
};
struct Program {
  size_t struct_size;
  ExtensionBase* extension_start;
  char* code;
  size_t code_size;
  const char* format;  // "mlir" (StableHLO text or bytecode) or "hlo"
  size_t format_size;
};
struct ClientCompileArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
  const Program* program;
  const char* compile_options;  // a serialized xla.CompileOptionsProto
  size_t compile_options_size;
  LoadedExecutable* executable;  // out
};
struct ClientBufferFromHostBufferArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
  const void* data;
  BufferType type;
  const int64_t* dims;
  size_t num_dims;
  const int64_t* byte_strides;  // null: dense, row-major
  size_t num_byte_strides;
  HostBufferSemantics host_buffer_semantics;
  Device* device;
  Memory* memory;               // null: the device's default memory
  void* device_layout;          // null: the default layout
  Event* done_with_host_buffer;  // out
  Buffer* buffer;                // out
};
struct DeviceGetDescriptionArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Device* device;
  DeviceDescription* device_description;  // out
};
struct DeviceDescriptionKindArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  DeviceDescription* device_description;
  const char* device_kind;  // out
  size_t device_kind_size;  // out
};
struct ExecuteOptions {
  size_t struct_size;
  ExtensionBase* extension_start;
  void** send_callbacks;
  void** recv_callbacks;
  size_t num_send_ops;
  size_t num_recv_ops;
  int launch_id;
  const int64_t* non_donatable_input_indices;
  size_t num_non_donatable_input_indices;
  void* context;
  const char* call_location;
  size_t num_tasks;
  int* task_ids;
  int64_t* incarnation_ids;
};
struct LoadedExecutableExecuteArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  LoadedExecutable* executable;
  ExecuteOptions* options;
  Buffer* const* const* argument_lists;  // [num_devices][num_args]
  size_t num_devices;
  size_t num_args;
  Buffer** const* output_lists;     // [num_devices][num_outputs], filled in
  Event** device_complete_events;   // null: not wanted
  Device* execute_device;           // null: the executable's own device
};
struct LoadedExecutableDestroyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  LoadedExecutable* executable;
};
struct Executable;
struct SerializedExecutable;
struct ExecutableDestroyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Executable* executable;
};
struct LoadedExecutableGetExecutableArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  LoadedExecutable* loaded_executable;
  Executable* executable;  // out; freed with Executable_Destroy
};
struct ExecutableSerializeArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const Executable* executable;
  const char* serialized_bytes;  // out, valid until the deleter runs
  size_t serialized_bytes_size;  // out
  SerializedExecutable* serialized_executable;                         // out
  void (*serialized_executable_deleter)(SerializedExecutable* exec);  // out
};
struct ExecutableDeserializeAndLoadArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Client* client;
  const char* serialized_executable;
  size_t serialized_executable_size;
  LoadedExecutable* loaded_executable;  // out
  const char* overridden_serialized_compile_options;  // null: the executable's own
  size_t overridden_serialized_compile_options_size;
};
struct BufferDestroyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Buffer* buffer;
};
struct BufferToHostBufferArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Buffer* src;
  void* host_layout;  // null: dense, row-major
  void* dst;
  size_t dst_size;
  Event* event;  // out
};
struct BufferReadyEventArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  Buffer* buffer;
  Event* event;  // out
};

// The function table, in the API's order. `Unused` entries are functions
// troupe does not call.
using Unused = void (*)();
template <typename Args>
using Fn = Error* (*)(Args*);

struct Api {
  size_t struct_size;
  ExtensionBase* extension_start;
  struct Version {
    size_t struct_size;
    ExtensionBase* extension_start;
    int major_version;
    int minor_version;
  } pjrt_api_version;

  void (*Error_Destroy)(ErrorDestroyArgs*);
  void (*Error_Message)(ErrorMessageArgs*);
  Fn<ErrorGetCodeArgs> Error_GetCode;

  Fn<PluginInitializeArgs> Plugin_Initialize;
  Unused Plugin_Attributes;

  Fn<EventDestroyArgs> Event_Destroy;
  Unused Event_IsReady;
  Unused Event_Error;
  Fn<EventAwaitArgs> Event_Await;
  Fn<EventOnReadyArgs> Event_OnReady;

  Fn<ClientCreateArgs> Client_Create;
  Fn<ClientDestroyArgs> Client_Destroy;
  Fn<ClientPlatformNameArgs> Client_PlatformName;
  Unused Client_ProcessIndex;
  Unused Client_PlatformVersion;
  Unused Client_Devices;
  Fn<ClientAddressableDevicesArgs> Client_AddressableDevices;
  Unused Client_LookupDevice;
  Unused Client_LookupAddressableDevice;
  Unused Client_AddressableMemories;
  Fn<ClientCompileArgs> Client_Compile;
  Unused Client_DefaultDeviceAssignment;
  Fn<ClientBufferFromHostBufferArgs> Client_BufferFromHostBuffer;

  Unused DeviceDescription_Id;
  Unused DeviceDescription_ProcessIndex;
  Unused DeviceDescription_Attributes;
  Fn<DeviceDescriptionKindArgs> DeviceDescription_Kind;
  Unused DeviceDescription_DebugString;
  Unused DeviceDescription_ToString;

  Fn<DeviceGetDescriptionArgs> Device_GetDescription;
  Unused Device_IsAddressable;
  Unused Device_LocalHardwareId;
  Unused Device_AddressableMemories;
  Unused Device_DefaultMemory;
  Unused Device_MemoryStats;

  Unused Memory_Id;
  Unused Memory_Kind;
  Unused Memory_DebugString;
  Unused Memory_ToString;
  Unused Memory_AddressableByDevices;

  Fn<ExecutableDestroyArgs> Executable_Destroy;
  Unused Executable_Name;
  Unused Executable_NumReplicas;
  Unused Executable_NumPartitions;
  Unused Executable_NumOutputs;
  Unused Executable_SizeOfGeneratedCodeInBytes;
  Unused Executable_GetCostAnalysis;
  Unused Executable_OutputMemoryKinds;
  Unused Executable_OptimizedProgram;
  Fn<ExecutableSerializeArgs> Executable_Serialize;

  Fn<LoadedExecutableDestroyArgs> LoadedExecutable_Destroy;
  Fn<LoadedExecutableGetExecutableArgs> LoadedExecutable_GetExecutable;
  Unused LoadedExecutable_AddressableDevices;
  Unused LoadedExecutable_Delete;
  Unused LoadedExecutable_IsDeleted;
  Fn<LoadedExecutableExecuteArgs> LoadedExecutable_Execute;
  Fn<ExecutableDeserializeAndLoadArgs> Executable_DeserializeAndLoad;
  Unused LoadedExecutable_Fingerprint;

  Fn<BufferDestroyArgs> Buffer_Destroy;
  Unused Buffer_ElementType;
  Unused Buffer_Dimensions;
  Unused Buffer_UnpaddedDimensions;
  Unused Buffer_DynamicDimensionIndices;
  Unused Buffer_GetMemoryLayout;
  Unused Buffer_OnDeviceSizeInBytes;
  Unused Buffer_Device;
  Unused Buffer_Memory;
  Unused Buffer_Delete;
  Unused Buffer_IsDeleted;
  Unused Buffer_CopyToDevice;
  Fn<BufferToHostBufferArgs> Buffer_ToHostBuffer;
  Unused Buffer_IsOnCpu;
  Fn<BufferReadyEventArgs> Buffer_ReadyEvent;
  // ... later entries are not used by troupe.
};

// The end of the last table entry troupe calls: a plugin's table must be at
// least this long (Api::struct_size).
inline constexpr size_t kApiSizeNeeded = offsetof(Api, Buffer_ReadyEvent) + sizeof(void*);

// The symbol a plugin exports.
using GetPjrtApiFn = const Api* (*)();
inline constexpr const char* kGetPjrtApiSymbol = "GetPjrtApi";

}  // namespace troupe::pjrt::capi

#endif  // TROUPE_ENGINE_PJRT_PJRT_C_API_H_
