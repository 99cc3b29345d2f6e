// troupe's declarations of the PJRT C API (pjrt_c_api.h here) against a
// plugin's own header, field by field: compiled (-fsyntax-only) by
// tools/pjrt_layout_check.sh where such a header is at hand
// (TROUPE_PJRT_REFERENCE_HEADER, the xla-cpu-pjrt wheel's), so a wrong
// offset is a compile error there, not memory corruption at run time.
#include <cstddef>

#include "engine/pjrt/pjrt_c_api.h"
#include TROUPE_PJRT_REFERENCE_HEADER

namespace troupe::pjrt::capi {
namespace {

// Same offset, and the same size as the field (so no neighbour overlaps it).
#define TROUPE_SAME_FIELD(ours, theirs, field)                                         \
  static_assert(offsetof(ours, field) == offsetof(theirs, field), #ours "." #field); \
  static_assert(sizeof(ours::field) == sizeof(theirs::field), #ours "." #field " size")
// Same head and same whole size: plugins refuse a struct shorter than theirs.
#define TROUPE_SAME_HEAD(ours, theirs)                                     \
  static_assert(sizeof(ours) == sizeof(theirs), #ours " size");            \
  TROUPE_SAME_FIELD(ours, theirs, struct_size);                            \
  TROUPE_SAME_FIELD(ours, theirs, extension_start)

TROUPE_SAME_HEAD(ErrorDestroyArgs, PJRT_Error_Destroy_Args);
TROUPE_SAME_HEAD(ErrorGetCodeArgs, PJRT_Error_GetCode_Args);
TROUPE_SAME_HEAD(EventDestroyArgs, PJRT_Event_Destroy_Args);
TROUPE_SAME_HEAD(EventAwaitArgs, PJRT_Event_Await_Args);
TROUPE_SAME_HEAD(ClientCreateArgs, PJRT_Client_Create_Args);
TROUPE_SAME_HEAD(ClientDestroyArgs, PJRT_Client_Destroy_Args);
TROUPE_SAME_HEAD(ClientPlatformNameArgs, PJRT_Client_PlatformName_Args);
TROUPE_SAME_HEAD(ExecutableDestroyArgs, PJRT_Executable_Destroy_Args);
TROUPE_SAME_HEAD(LoadedExecutableGetExecutableArgs, PJRT_LoadedExecutable_GetExecutable_Args);
TROUPE_SAME_HEAD(ExecutableSerializeArgs, PJRT_Executable_Serialize_Args);
TROUPE_SAME_HEAD(ExecutableDeserializeAndLoadArgs, PJRT_Executable_DeserializeAndLoad_Args);
TROUPE_SAME_HEAD(ClientAddressableDevicesArgs, PJRT_Client_AddressableDevices_Args);
TROUPE_SAME_HEAD(Program, PJRT_Program);
TROUPE_SAME_HEAD(ClientCompileArgs, PJRT_Client_Compile_Args);
TROUPE_SAME_HEAD(ClientBufferFromHostBufferArgs, PJRT_Client_BufferFromHostBuffer_Args);
TROUPE_SAME_HEAD(DeviceGetDescriptionArgs, PJRT_Device_GetDescription_Args);
TROUPE_SAME_HEAD(DeviceDescriptionKindArgs, PJRT_DeviceDescription_Kind_Args);
TROUPE_SAME_HEAD(ExecuteOptions, PJRT_ExecuteOptions);
TROUPE_SAME_HEAD(LoadedExecutableExecuteArgs, PJRT_LoadedExecutable_Execute_Args);
TROUPE_SAME_HEAD(LoadedExecutableDestroyArgs, PJRT_LoadedExecutable_Destroy_Args);
TROUPE_SAME_HEAD(BufferDestroyArgs, PJRT_Buffer_Destroy_Args);
TROUPE_SAME_HEAD(BufferToHostBufferArgs, PJRT_Buffer_ToHostBuffer_Args);
TROUPE_SAME_HEAD(BufferReadyEventArgs, PJRT_Buffer_ReadyEvent_Args);
TROUPE_SAME_FIELD(ErrorDestroyArgs, PJRT_Error_Destroy_Args, error);
TROUPE_SAME_HEAD(ErrorMessageArgs, PJRT_Error_Message_Args);
TROUPE_SAME_FIELD(ErrorMessageArgs, PJRT_Error_Message_Args, error);
TROUPE_SAME_FIELD(ErrorMessageArgs, PJRT_Error_Message_Args, message);
TROUPE_SAME_FIELD(ErrorMessageArgs, PJRT_Error_Message_Args, message_size);
TROUPE_SAME_FIELD(ErrorGetCodeArgs, PJRT_Error_GetCode_Args, code);
TROUPE_SAME_HEAD(PluginInitializeArgs, PJRT_Plugin_Initialize_Args);
TROUPE_SAME_FIELD(EventDestroyArgs, PJRT_Event_Destroy_Args, event);
TROUPE_SAME_FIELD(EventAwaitArgs, PJRT_Event_Await_Args, event);
TROUPE_SAME_HEAD(NamedValue, PJRT_NamedValue);
TROUPE_SAME_FIELD(NamedValue, PJRT_NamedValue, name);
TROUPE_SAME_FIELD(NamedValue, PJRT_NamedValue, name_size);
TROUPE_SAME_FIELD(NamedValue, PJRT_NamedValue, type);
TROUPE_SAME_FIELD(NamedValue, PJRT_NamedValue, float_value);
TROUPE_SAME_FIELD(NamedValue, PJRT_NamedValue, bool_value);
TROUPE_SAME_FIELD(NamedValue, PJRT_NamedValue, value_size);
static_assert(int{kNamedFloat} == int{PJRT_NamedValue_kFloat} && int{kNamedBool} == int{PJRT_NamedValue_kBool}, "NamedValue types");
TROUPE_SAME_FIELD(ClientCreateArgs, PJRT_Client_Create_Args, create_options);
TROUPE_SAME_FIELD(ClientCreateArgs, PJRT_Client_Create_Args, num_options);
TROUPE_SAME_FIELD(ClientCreateArgs, PJRT_Client_Create_Args, kv_put_user_arg);
TROUPE_SAME_FIELD(ClientCreateArgs, PJRT_Client_Create_Args, client);
TROUPE_SAME_FIELD(ClientCreateArgs, PJRT_Client_Create_Args, kv_try_get_user_arg);
TROUPE_SAME_FIELD(ClientDestroyArgs, PJRT_Client_Destroy_Args, client);
TROUPE_SAME_FIELD(ClientPlatformNameArgs, PJRT_Client_PlatformName_Args, platform_name);
TROUPE_SAME_FIELD(ClientPlatformNameArgs, PJRT_Client_PlatformName_Args, platform_name_size);
TROUPE_SAME_FIELD(ClientAddressableDevicesArgs, PJRT_Client_AddressableDevices_Args, addressable_devices);
TROUPE_SAME_FIELD(ClientAddressableDevicesArgs, PJRT_Client_AddressableDevices_Args, num_addressable_devices);
TROUPE_SAME_FIELD(Program, PJRT_Program, code);
TROUPE_SAME_FIELD(Program, PJRT_Program, code_size);
TROUPE_SAME_FIELD(Program, PJRT_Program, format);
TROUPE_SAME_FIELD(Program, PJRT_Program, format_size);
TROUPE_SAME_FIELD(ClientCompileArgs, PJRT_Client_Compile_Args, program);
TROUPE_SAME_FIELD(ClientCompileArgs, PJRT_Client_Compile_Args, compile_options);
TROUPE_SAME_FIELD(ClientCompileArgs, PJRT_Client_Compile_Args, compile_options_size);
TROUPE_SAME_FIELD(ClientCompileArgs, PJRT_Client_Compile_Args, executable);
TROUPE_SAME_FIELD(ClientBufferFromHostBufferArgs, PJRT_Client_BufferFromHostBuffer_Args, data);
TROUPE_SAME_FIELD(ClientBufferFromHostBufferArgs, PJRT_Client_BufferFromHostBuffer_Args, type);
TROUPE_SAME_FIELD(ClientBufferFromHostBufferArgs, PJRT_Client_BufferFromHostBuffer_Args, dims);
TROUPE_SAME_FIELD(ClientBufferFromHostBufferArgs, PJRT_Client_BufferFromHostBuffer_Args, num_dims);
TROUPE_SAME_FIELD(ClientBufferFromHostBufferArgs, PJRT_Client_BufferFromHostBuffer_Args, num_byte_strides);
TROUPE_SAME_FIELD(ClientBufferFromHostBufferArgs, PJRT_Client_BufferFromHostBuffer_Args, host_buffer_semantics);
TROUPE_SAME_FIELD(ClientBufferFromHostBufferArgs, PJRT_Client_BufferFromHostBuffer_Args, device);
TROUPE_SAME_FIELD(ClientBufferFromHostBufferArgs, PJRT_Client_BufferFromHostBuffer_Args, memory);
TROUPE_SAME_FIELD(ClientBufferFromHostBufferArgs, PJRT_Client_BufferFromHostBuffer_Args, device_layout);
TROUPE_SAME_FIELD(ClientBufferFromHostBufferArgs, PJRT_Client_BufferFromHostBuffer_Args, done_with_host_buffer);
TROUPE_SAME_FIELD(ClientBufferFromHostBufferArgs, PJRT_Client_BufferFromHostBuffer_Args, buffer);
TROUPE_SAME_FIELD(DeviceGetDescriptionArgs, PJRT_Device_GetDescription_Args, device_description);
TROUPE_SAME_FIELD(DeviceDescriptionKindArgs, PJRT_DeviceDescription_Kind_Args, device_kind);
TROUPE_SAME_FIELD(DeviceDescriptionKindArgs, PJRT_DeviceDescription_Kind_Args, device_kind_size);
TROUPE_SAME_FIELD(ExecuteOptions, PJRT_ExecuteOptions, launch_id);
TROUPE_SAME_FIELD(ExecuteOptions, PJRT_ExecuteOptions, non_donatable_input_indices);
TROUPE_SAME_FIELD(ExecuteOptions, PJRT_ExecuteOptions, num_non_donatable_input_indices);
TROUPE_SAME_FIELD(ExecuteOptions, PJRT_ExecuteOptions, context);
TROUPE_SAME_FIELD(ExecuteOptions, PJRT_ExecuteOptions, incarnation_ids);
TROUPE_SAME_FIELD(LoadedExecutableExecuteArgs, PJRT_LoadedExecutable_Execute_Args, executable);
TROUPE_SAME_FIELD(LoadedExecutableExecuteArgs, PJRT_LoadedExecutable_Execute_Args, options);
TROUPE_SAME_FIELD(LoadedExecutableExecuteArgs, PJRT_LoadedExecutable_Execute_Args, argument_lists);
TROUPE_SAME_FIELD(LoadedExecutableExecuteArgs, PJRT_LoadedExecutable_Execute_Args, num_devices);
TROUPE_SAME_FIELD(LoadedExecutableExecuteArgs, PJRT_LoadedExecutable_Execute_Args, num_args);
TROUPE_SAME_FIELD(LoadedExecutableExecuteArgs, PJRT_LoadedExecutable_Execute_Args, output_lists);
TROUPE_SAME_FIELD(LoadedExecutableExecuteArgs, PJRT_LoadedExecutable_Execute_Args, device_complete_events);
TROUPE_SAME_FIELD(LoadedExecutableExecuteArgs, PJRT_LoadedExecutable_Execute_Args, execute_device);
TROUPE_SAME_FIELD(LoadedExecutableDestroyArgs, PJRT_LoadedExecutable_Destroy_Args, executable);
TROUPE_SAME_FIELD(ExecutableDestroyArgs, PJRT_Executable_Destroy_Args, executable);
TROUPE_SAME_FIELD(LoadedExecutableGetExecutableArgs, PJRT_LoadedExecutable_GetExecutable_Args, loaded_executable);
TROUPE_SAME_FIELD(LoadedExecutableGetExecutableArgs, PJRT_LoadedExecutable_GetExecutable_Args, executable);
TROUPE_SAME_FIELD(ExecutableSerializeArgs, PJRT_Executable_Serialize_Args, executable);
TROUPE_SAME_FIELD(ExecutableSerializeArgs, PJRT_Executable_Serialize_Args, serialized_bytes);
TROUPE_SAME_FIELD(ExecutableSerializeArgs, PJRT_Executable_Serialize_Args, serialized_bytes_size);
TROUPE_SAME_FIELD(ExecutableSerializeArgs, PJRT_Executable_Serialize_Args, serialized_executable);
TROUPE_SAME_FIELD(ExecutableSerializeArgs, PJRT_Executable_Serialize_Args, serialized_executable_deleter);
TROUPE_SAME_FIELD(ExecutableDeserializeAndLoadArgs, PJRT_Executable_DeserializeAndLoad_Args, client);
TROUPE_SAME_FIELD(ExecutableDeserializeAndLoadArgs, PJRT_Executable_DeserializeAndLoad_Args, serialized_executable);
TROUPE_SAME_FIELD(ExecutableDeserializeAndLoadArgs, PJRT_Executable_DeserializeAndLoad_Args, serialized_executable_size);
TROUPE_SAME_FIELD(ExecutableDeserializeAndLoadArgs, PJRT_Executable_DeserializeAndLoad_Args, loaded_executable);
TROUPE_SAME_FIELD(ExecutableDeserializeAndLoadArgs, PJRT_Executable_DeserializeAndLoad_Args,
                  overridden_serialized_compile_options_size);
TROUPE_SAME_FIELD(BufferDestroyArgs, PJRT_Buffer_Destroy_Args, buffer);
TROUPE_SAME_FIELD(BufferToHostBufferArgs, PJRT_Buffer_ToHostBuffer_Args, src);
TROUPE_SAME_FIELD(BufferToHostBufferArgs, PJRT_Buffer_ToHostBuffer_Args, host_layout);
TROUPE_SAME_FIELD(BufferToHostBufferArgs, PJRT_Buffer_ToHostBuffer_Args, dst);
TROUPE_SAME_FIELD(BufferToHostBufferArgs, PJRT_Buffer_ToHostBuffer_Args, dst_size);
TROUPE_SAME_FIELD(BufferToHostBufferArgs, PJRT_Buffer_ToHostBuffer_Args, event);
TROUPE_SAME_FIELD(BufferReadyEventArgs, PJRT_Buffer_ReadyEvent_Args, event);

// The function table: every entry troupe calls at the plugin's offset.
TROUPE_SAME_FIELD(Api, PJRT_Api, pjrt_api_version);
#define TROUPE_SAME_ENTRY(name) static_assert(offsetof(Api, name) == offsetof(PJRT_Api, PJRT_##name), #name)
TROUPE_SAME_ENTRY(Error_Destroy);
TROUPE_SAME_ENTRY(Error_Message);
TROUPE_SAME_ENTRY(Error_GetCode);
TROUPE_SAME_ENTRY(Plugin_Initialize);
TROUPE_SAME_ENTRY(Event_Destroy);
TROUPE_SAME_ENTRY(Event_Await);
TROUPE_SAME_ENTRY(Client_Create);
TROUPE_SAME_ENTRY(Client_Destroy);
TROUPE_SAME_ENTRY(Client_PlatformName);
TROUPE_SAME_ENTRY(Client_AddressableDevices);
TROUPE_SAME_ENTRY(Client_Compile);
TROUPE_SAME_ENTRY(Client_BufferFromHostBuffer);
TROUPE_SAME_ENTRY(DeviceDescription_Kind);
TROUPE_SAME_ENTRY(Device_GetDescription);
TROUPE_SAME_ENTRY(LoadedExecutable_Destroy);
TROUPE_SAME_ENTRY(LoadedExecutable_Execute);
TROUPE_SAME_ENTRY(Executable_Destroy);
TROUPE_SAME_ENTRY(Executable_Serialize);
TROUPE_SAME_ENTRY(LoadedExecutable_GetExecutable);
TROUPE_SAME_ENTRY(Executable_DeserializeAndLoad);
TROUPE_SAME_ENTRY(Buffer_Destroy);
TROUPE_SAME_ENTRY(Buffer_ToHostBuffer);
TROUPE_SAME_ENTRY(Buffer_ReadyEvent);

// The enums troupe passes.
static_assert(int{kF32} == int{PJRT_Buffer_Type_F32} && int{kS32} == int{PJRT_Buffer_Type_S32} &&
              int{kU8} == int{PJRT_Buffer_Type_U8});
static_assert(int{kImmutableOnlyDuringCall} == int{PJRT_HostBufferSemantics_kImmutableOnlyDuringCall});
static_assert(int{kUnauthenticated} == int{PJRT_Error_Code_UNAUTHENTICATED} && int{kInternal} == int{PJRT_Error_Code_INTERNAL});

// The layouts above are the baseline's; a reference header older than it
// could lack fields troupe sets.
static_assert(PJRT_API_MAJOR == kSupportedMajor && PJRT_API_MINOR >= kBaselineMinor);
static_assert(kApiSizeNeeded <= sizeof(PJRT_Api));

}  // namespace
}  // namespace troupe::pjrt::capi
