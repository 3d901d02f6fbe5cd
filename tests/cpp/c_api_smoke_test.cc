// Drives the FlexNPU plugin through its C API only (dlopen + GetPjrtApi), as a PJRT host such
// as JAX does, without Python: client, devices, compile, transfers, execute, and error paths.
// Runs under AddressSanitizer and UndefinedBehaviorSanitizer in CI.
#include "c_api_test_fixture.h"

namespace {

TEST_F(CApiTest, AdvertisesTheHeaderVersion) {
  EXPECT_EQ(api->pjrt_api_version.major_version, PJRT_API_MAJOR);
  EXPECT_EQ(api->pjrt_api_version.minor_version, PJRT_API_MINOR);
  EXPECT_GE(api->struct_size, PJRT_Api_STRUCT_SIZE);
}

TEST_F(CApiTest, VirtualDevicesAndMemories) {
  PJRT_Client* client = CreateClient(6);
  ASSERT_NE(client, nullptr);
  PJRT_Client_PlatformName_Args name{};
  name.struct_size = PJRT_Client_PlatformName_Args_STRUCT_SIZE;
  name.client = client;
  ASSERT_PJRT_OK(api->PJRT_Client_PlatformName(&name));
  EXPECT_EQ(std::string(name.platform_name, name.platform_name_size), "flexnpu");

  PJRT_Client_AddressableDevices_Args devices{};
  devices.struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE;
  devices.client = client;
  ASSERT_PJRT_OK(api->PJRT_Client_AddressableDevices(&devices));
  ASSERT_EQ(devices.num_addressable_devices, 6u);
  for (size_t i = 0; i < 6; ++i) {
    PJRT_Device_GetDescription_Args desc{};
    desc.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE;
    desc.device = devices.addressable_devices[i];
    ASSERT_PJRT_OK(api->PJRT_Device_GetDescription(&desc));
    PJRT_DeviceDescription_Kind_Args kind{};
    kind.struct_size = PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE;
    kind.device_description = desc.device_description;
    ASSERT_PJRT_OK(api->PJRT_DeviceDescription_Kind(&kind));
    EXPECT_EQ(std::string(kind.device_kind, kind.device_kind_size), "virtual NPU");
    PJRT_DeviceDescription_Id_Args id{};
    id.struct_size = PJRT_DeviceDescription_Id_Args_STRUCT_SIZE;
    id.device_description = desc.device_description;
    ASSERT_PJRT_OK(api->PJRT_DeviceDescription_Id(&id));
    EXPECT_EQ(id.id, static_cast<int>(i));

    PJRT_Device_DefaultMemory_Args memory{};
    memory.struct_size = PJRT_Device_DefaultMemory_Args_STRUCT_SIZE;
    memory.device = devices.addressable_devices[i];
    ASSERT_PJRT_OK(api->PJRT_Device_DefaultMemory(&memory));
    PJRT_Memory_AddressableByDevices_Args by{};
    by.struct_size = PJRT_Memory_AddressableByDevices_Args_STRUCT_SIZE;
    by.memory = memory.memory;
    ASSERT_PJRT_OK(api->PJRT_Memory_AddressableByDevices(&by));
    ASSERT_EQ(by.num_devices, 1u);
    EXPECT_EQ(by.devices[0], devices.addressable_devices[i]);
  }

  PJRT_Client_LookupDevice_Args lookup{};
  lookup.struct_size = PJRT_Client_LookupDevice_Args_STRUCT_SIZE;
  lookup.client = client;
  lookup.id = 6;
  ErrorInfo info = Info(api->PJRT_Client_LookupDevice(&lookup));
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("no virtual device with id 6"), std::string::npos) << info.message;
}

TEST_F(CApiTest, CompileTransferExecuteReadBack) {
  PJRT_Client* client = CreateClient(6);
  PJRT_Device* device = Device(client, 5);  // virtual 5 over physical 1
  PJRT_LoadedExecutable* exe = nullptr;
  ErrorInfo compiled = TryCompile(client, kAddProgram, CompileOptionsFor(5), &exe);
  ASSERT_EQ(compiled.code, PJRT_Error_Code_OK) << compiled.message;

  PJRT_LoadedExecutable_AddressableDevices_Args where{};
  where.struct_size = PJRT_LoadedExecutable_AddressableDevices_Args_STRUCT_SIZE;
  where.executable = exe;
  ASSERT_PJRT_OK(api->PJRT_LoadedExecutable_AddressableDevices(&where));
  ASSERT_EQ(where.num_addressable_devices, 1u);
  EXPECT_EQ(where.addressable_devices[0], device);

  PJRT_Buffer* a = Upload(client, device, {1, 2, 3, 4});
  PJRT_Buffer* b = Upload(client, device, {10, 20, 30, 40});
  PJRT_Buffer* out = nullptr;
  ErrorInfo ran = TryExecute(exe, {a, b}, &out);
  ASSERT_EQ(ran.code, PJRT_Error_Code_OK) << ran.message;
  EXPECT_EQ(Download(out, 4), (std::vector<float>{110, 440, 990, 1760}));

  PJRT_Buffer_Device_Args out_device{};
  out_device.struct_size = PJRT_Buffer_Device_Args_STRUCT_SIZE;
  out_device.buffer = out;
  ASSERT_PJRT_OK(api->PJRT_Buffer_Device(&out_device));
  EXPECT_EQ(out_device.device, device);

  PJRT_Device_MemoryStats_Args stats{};
  stats.struct_size = PJRT_Device_MemoryStats_Args_STRUCT_SIZE;
  stats.device = device;
  ASSERT_PJRT_OK(api->PJRT_Device_MemoryStats(&stats));
  EXPECT_EQ(stats.bytes_in_use, 3 * 16);

  // A copy to another virtual device lands there and is independent of the source.
  PJRT_Buffer_CopyToDevice_Args copy{};
  copy.struct_size = PJRT_Buffer_CopyToDevice_Args_STRUCT_SIZE;
  copy.buffer = out;
  copy.dst_device = Device(client, 2);
  ASSERT_PJRT_OK(api->PJRT_Buffer_CopyToDevice(&copy));
  buffers_.push_back(copy.dst_buffer);
  EXPECT_EQ(Download(copy.dst_buffer, 4), (std::vector<float>{110, 440, 990, 1760}));
}

// platform_name: the physical platform's name and device kinds for frameworks that know only
// tpu/gpu/cpu; any other name is refused naming both.
TEST_F(CApiTest, PlatformNameMayBeThePhysicalPlatformsOnly) {
  PJRT_Client* client = nullptr;
  ErrorInfo created = TryCreateClient({StringOption("platform_name", "cpu")}, &client);
  ASSERT_EQ(created.code, PJRT_Error_Code_OK) << created.message;
  PJRT_Client_PlatformName_Args name{};
  name.struct_size = PJRT_Client_PlatformName_Args_STRUCT_SIZE;
  name.client = client;
  ASSERT_PJRT_OK(api->PJRT_Client_PlatformName(&name));
  EXPECT_EQ(std::string(name.platform_name, name.platform_name_size), "cpu");
  PJRT_Device_GetDescription_Args desc{};
  desc.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE;
  desc.device = Device(client, 0);
  ASSERT_PJRT_OK(api->PJRT_Device_GetDescription(&desc));
  PJRT_DeviceDescription_Kind_Args kind{};
  kind.struct_size = PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE;
  kind.device_description = desc.device_description;
  ASSERT_PJRT_OK(api->PJRT_DeviceDescription_Kind(&kind));
  EXPECT_EQ(std::string(kind.device_kind, kind.device_kind_size), "cpu");

  PJRT_Client* refused = nullptr;
  ErrorInfo info = TryCreateClient({StringOption("platform_name", "tpu")}, &refused);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("'tpu'"), std::string::npos) << info.message;
  EXPECT_NE(info.message.find("which is 'cpu'"), std::string::npos) << info.message;
}

TEST_F(CApiTest, ExecutionErrorsAreReportedWithCodeAndMessage) {
  PJRT_Client* client = CreateClient(4);
  PJRT_Client* other = CreateClient(4);
  PJRT_Device* device = Device(client, 1);
  PJRT_LoadedExecutable* exe = nullptr;
  ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(1), &exe).code, PJRT_Error_Code_OK);
  PJRT_Buffer* a = Upload(client, device, {1, 2, 3, 4});
  PJRT_Buffer* foreign_client = Upload(other, Device(other, 1), {1, 2, 3, 4});
  PJRT_Buffer* out = nullptr;

  ErrorInfo info = TryExecute(exe, {a, foreign_client}, &out);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("argument 1 for device 0 belongs to another FlexNPU client"),
            std::string::npos)
      << info.message;

  uint64_t not_a_buffer[8] = {};
  info = TryExecute(exe, {a, reinterpret_cast<PJRT_Buffer*>(not_a_buffer)}, &out);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("is not a FlexNPU buffer"), std::string::npos) << info.message;

  PJRT_Buffer* b = Upload(client, device, {1, 1, 1, 1});
  PJRT_Buffer_Delete_Args del{};
  del.struct_size = PJRT_Buffer_Delete_Args_STRUCT_SIZE;
  del.buffer = b;
  ASSERT_PJRT_OK(api->PJRT_Buffer_Delete(&del));
  PJRT_Buffer_IsDeleted_Args is_deleted{};
  is_deleted.struct_size = PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE;
  is_deleted.buffer = b;
  ASSERT_PJRT_OK(api->PJRT_Buffer_IsDeleted(&is_deleted));
  EXPECT_TRUE(is_deleted.is_deleted);
  info = TryExecute(exe, {a, b}, &out);
  EXPECT_NE(info.code, PJRT_Error_Code_OK);
  EXPECT_NE(info.message.find("physical backend: PJRT_LoadedExecutable_Execute"), std::string::npos)
      << info.message;
  EXPECT_NE(info.message.find("deleted"), std::string::npos) << info.message;

  PJRT_Buffer_Device_Args too_small{};
  too_small.struct_size = 8;
  too_small.buffer = a;
  info = Info(api->PJRT_Buffer_Device(&too_small));
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("struct_size 8 is too small"), std::string::npos);
}

TEST_F(CApiTest, CompileErrorsNameTheProblem) {
  PJRT_Client* client = CreateClient(4);
  PJRT_LoadedExecutable* exe = nullptr;
  ErrorInfo info = TryCompile(client, kAddProgram, CompileOptionsFor(9), &exe);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("assign virtual device id 9"), std::string::npos) << info.message;

  info = TryCompile(client, "this is not MLIR", CompileOptionsFor(0), &exe);
  EXPECT_NE(info.code, PJRT_Error_Code_OK);
  EXPECT_NE(info.message.find("physical backend: PJRT_Client_Compile"), std::string::npos)
      << info.message;

  info = TryCompile(client, kAddProgram, std::string("\x1a\x40", 2), &exe);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("malformed compile options"), std::string::npos) << info.message;
}

TEST_F(CApiTest, BadClientOptionsAreInvalidArgument) {
  PJRT_Client* client = nullptr;
  ErrorInfo info = TryCreateClient({IntOption("virtual_devices", 2)}, &client);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("unknown FlexNPU create option 'virtual_devices'"), std::string::npos);

  info = TryCreateClient({StringOption("backend", "/no/such/plugin.so")}, &client);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("cannot load physical backend '/no/such/plugin.so'"),
            std::string::npos);
}

}  // namespace
