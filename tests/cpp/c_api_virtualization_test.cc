// Virtualization through the C API only (dlopen + GetPjrtApi): buffers that move between
// physical devices while the host reads them zero-copy, executions racing buffer destruction
// and policy switches, argument structs of other sizes, null lists, the inner API version
// rule, missing inner slots and event callbacks as JAX uses them. Run under ASan/UBSan and
// ThreadSanitizer in CI: a use-after-free or a race there fails the test.
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <future>
#include <thread>

#include "c_api_test_fixture.h"

namespace {

constexpr int64_t kElements = 16384;

constexpr char kAdd16kProgram[] = R"(
module @add16k attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a: tensor<16384xf32>, %b: tensor<16384xf32>) -> tensor<16384xf32> {
    %0 = stablehlo.add %a, %b : tensor<16384xf32>
    return %0 : tensor<16384xf32>
  }
})";

constexpr char kConstantProgram[] = R"(
module @constant attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main() -> tensor<4xf32> {
    %0 = stablehlo.constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
})";

std::string Backend(const char* name) {
  const std::string dir = Env("FLEXNPU_TEST_FAKE_BACKEND_DIR");
  return dir.empty() ? "" : dir + "/" + name;
}

// A number from FlexNpu_StatsJson of the first client, e.g. "migrations".
int64_t StatOfFirstClient(const std::string& key) {
  auto stats = reinterpret_cast<const char* (*)()>(dlsym(plugin_library, "FlexNpu_StatsJson"));
  if (stats == nullptr) return -1;
  const std::string json = stats();
  const size_t at = json.find("\"" + key + "\":");
  if (at == std::string::npos) return -1;
  return std::atoll(json.c_str() + at + key.size() + 3);
}

class CApiVirtualizationTest : public CApiTest {
 public:
  PJRT_Client* CreateClientWith(std::vector<PJRT_NamedValue> options) {
    PJRT_Client* client = nullptr;
    ErrorInfo info = TryCreateClient(std::move(options), &client);
    EXPECT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    return client;
  }
};

// Readers alias the buffers' memory (external reference + opaque pointer, as np.asarray does)
// while executions on the dynamic policy move the same buffers between physical devices.
void ZeroCopyReadsWhileMoving(CApiVirtualizationTest* test, PJRT_Client* client,
                              const std::vector<PJRT_LoadedExecutable*>& executables,
                              const std::vector<PJRT_Buffer*>& buffers) {
  const int n = static_cast<int>(buffers.size());
  std::atomic<int> runners_left{3};
  std::atomic<int64_t> wrong{0}, reads{0}, errors{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 3; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 150; ++i) {
        // Inputs on two virtual devices over different physical ones: every execution moves at
        // least one of them, and the buffers ping-pong between physical devices.
        const int v = (k + i) % n;
        const int w = (v + 1) % n;
        PJRT_Buffer* out = nullptr;
        ErrorInfo info = CApiVirtualizationTest::Execute(executables[v], {buffers[v], buffers[w]},
                                                         &out, /*await=*/i % 2 == 0);
        if (info.code != PJRT_Error_Code_OK) {
          ++errors;
          continue;
        }
        if (i % 25 == 0) {
          std::vector<float> got = CApiTest::Download(out, kElements);
          for (float x : got) wrong += x != (v + 1.0f) + (w + 1.0f);
        }
        CApiTest::DestroyBuffer(out);
      }
      --runners_left;
    });
  }
  for (int k = 0; k < 3; ++k) {
    threads.emplace_back([&] {
      while (runners_left.load() > 0) {
        for (int v = 0; v < n; ++v) {
          PJRT_Buffer_IncreaseExternalReferenceCount_Args inc{};
          inc.struct_size = PJRT_Buffer_IncreaseExternalReferenceCount_Args_STRUCT_SIZE;
          inc.buffer = buffers[v];
          if (Info(api->PJRT_Buffer_IncreaseExternalReferenceCount(&inc)).code != 0) {
            ++errors;
            continue;
          }
          PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args ptr{};
          ptr.struct_size = PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args_STRUCT_SIZE;
          ptr.buffer = buffers[v];
          if (Info(api->PJRT_Buffer_OpaqueDeviceMemoryDataPointer(&ptr)).code != 0) ++errors;
          PJRT_Buffer_GetMemoryLayout_Args layout{};
          layout.struct_size = PJRT_Buffer_GetMemoryLayout_Args_STRUCT_SIZE;
          layout.buffer = buffers[v];
          if (Info(api->PJRT_Buffer_GetMemoryLayout(&layout)).code != 0) ++errors;
          PJRT_Buffer_UnpaddedDimensions_Args dims{};
          dims.struct_size = PJRT_Buffer_UnpaddedDimensions_Args_STRUCT_SIZE;
          dims.buffer = buffers[v];
          if (Info(api->PJRT_Buffer_UnpaddedDimensions(&dims)).code != 0) ++errors;
          const auto* data = static_cast<const float*>(ptr.device_memory_ptr);
          for (int64_t i = 0; data != nullptr && i < kElements; ++i) wrong += data[i] != v + 1.0f;
          ++reads;
          // The forwarded pointers are read after the data: moves happened meanwhile.
          if (dims.num_dims != 1 || dims.unpadded_dims[0] != kElements) ++wrong;
          if (layout.layout.type != PJRT_Buffer_MemoryLayout_Type_Tiled ||
              layout.layout.tiled.minor_to_major_size != 1 ||
              layout.layout.tiled.minor_to_major[0] != 0) {
            ++wrong;
          }
          PJRT_Buffer_DecreaseExternalReferenceCount_Args dec{};
          dec.struct_size = PJRT_Buffer_DecreaseExternalReferenceCount_Args_STRUCT_SIZE;
          dec.buffer = buffers[v];
          if (Info(api->PJRT_Buffer_DecreaseExternalReferenceCount(&dec)).code != 0) ++errors;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  (void)test;
  (void)client;
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(wrong.load(), 0) << "a reader saw values that were never stored";
}

void RunZeroCopyScenario(CApiVirtualizationTest* test, const char* compile_mode) {
  PJRT_Client* client = test->CreateClientWith(
      {CApiTest::IntOption("num_virtual_devices", 8), CApiTest::StringOption("policy", "dynamic"),
       CApiTest::StringOption("single_device_compile", compile_mode)});
  ASSERT_NE(client, nullptr);
  std::vector<PJRT_LoadedExecutable*> executables;
  std::vector<PJRT_Buffer*> buffers;
  for (int v = 0; v < 8; ++v) {
    PJRT_LoadedExecutable* exe = nullptr;
    ErrorInfo info = test->TryCompile(client, kAdd16kProgram, CompileOptionsFor(v), &exe);
    ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    executables.push_back(exe);
    buffers.push_back(test->Upload(client, test->Device(client, v),
                                   std::vector<float>(kElements, v + 1.0f)));
  }
  const int64_t migrations_before = StatOfFirstClient("migrations");
  ZeroCopyReadsWhileMoving(test, client, executables, buffers);
  // Only meaningful if buffers really moved while being read.
  EXPECT_GT(StatOfFirstClient("migrations"), migrations_before);
}

TEST_F(CApiVirtualizationTest, ZeroCopyReadsStayRightWhileBuffersMove) {
  RunZeroCopyScenario(this, "auto");
}

TEST_F(CApiVirtualizationTest, ZeroCopyReadsStayRightWithPinnedCompilesPerDevice) {
  RunZeroCopyScenario(this, "pinned");
}

TEST_F(CApiVirtualizationTest, ExternalReferencesMustBeBalanced) {
  PJRT_Client* client = CreateClient(4);
  PJRT_Buffer* buffer = Upload(client, Device(client, 1), {1, 2, 3, 4});
  for (int i = 0; i < 2; ++i) {
    PJRT_Buffer_IncreaseExternalReferenceCount_Args inc{};
    inc.struct_size = PJRT_Buffer_IncreaseExternalReferenceCount_Args_STRUCT_SIZE;
    inc.buffer = buffer;
    ASSERT_PJRT_OK(api->PJRT_Buffer_IncreaseExternalReferenceCount(&inc));
  }
  PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args ptr{};
  ptr.struct_size = PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args_STRUCT_SIZE;
  ptr.buffer = buffer;
  ASSERT_PJRT_OK(api->PJRT_Buffer_OpaqueDeviceMemoryDataPointer(&ptr));
  EXPECT_EQ(static_cast<const float*>(ptr.device_memory_ptr)[3], 4.0f);
  PJRT_Buffer_DecreaseExternalReferenceCount_Args dec{};
  dec.struct_size = PJRT_Buffer_DecreaseExternalReferenceCount_Args_STRUCT_SIZE;
  dec.buffer = buffer;
  ASSERT_PJRT_OK(api->PJRT_Buffer_DecreaseExternalReferenceCount(&dec));
  ASSERT_PJRT_OK(api->PJRT_Buffer_DecreaseExternalReferenceCount(&dec));
  ErrorInfo info = Info(api->PJRT_Buffer_DecreaseExternalReferenceCount(&dec));
  EXPECT_EQ(info.code, PJRT_Error_Code_FAILED_PRECONDITION);
  EXPECT_NE(info.message.find("without a matching increase"), std::string::npos) << info.message;
}

TEST_F(CApiVirtualizationTest, ExecuteWithoutArgumentsAcceptsNullArgumentLists) {
  PJRT_Client* client = CreateClient(4);
  PJRT_LoadedExecutable* exe = nullptr;
  ASSERT_EQ(TryCompile(client, kConstantProgram, CompileOptionsFor(2), &exe).code,
            PJRT_Error_Code_OK);
  PJRT_Buffer* outputs[1] = {nullptr};
  PJRT_Buffer** output_list = outputs;
  PJRT_LoadedExecutable_Execute_Args args{};
  args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  args.executable = exe;
  args.argument_lists = nullptr;
  args.num_devices = 1;
  args.num_args = 0;
  args.output_lists = &output_list;
  ASSERT_PJRT_OK(api->PJRT_LoadedExecutable_Execute(&args));
  buffers_.push_back(outputs[0]);
  EXPECT_EQ(Download(outputs[0], 4), (std::vector<float>{1, 2, 3, 4}));

  // A null list for a device that has outputs is an error, not a crash.
  PJRT_Buffer** null_output_list = nullptr;
  args.output_lists = &null_output_list;
  ErrorInfo info = Info(api->PJRT_LoadedExecutable_Execute(&args));
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("output_lists[0] is null"), std::string::npos) << info.message;
}

TEST_F(CApiVirtualizationTest, ExecuteAfterDeleteIsRefused) {
  PJRT_Client* client = CreateClient(4);
  PJRT_LoadedExecutable* exe = nullptr;
  ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(1), &exe).code, PJRT_Error_Code_OK);
  PJRT_Buffer* a = Upload(client, Device(client, 1), {1, 2, 3, 4});
  PJRT_LoadedExecutable_Delete_Args del{};
  del.struct_size = PJRT_LoadedExecutable_Delete_Args_STRUCT_SIZE;
  del.executable = exe;
  ASSERT_PJRT_OK(api->PJRT_LoadedExecutable_Delete(&del));
  PJRT_Buffer* out = nullptr;
  ErrorInfo info = Execute(exe, {a, a}, &out);
  EXPECT_EQ(info.code, PJRT_Error_Code_FAILED_PRECONDITION);
  EXPECT_NE(info.message.find("the executable has been deleted"), std::string::npos)
      << info.message;
}

// Recv callbacks would be handed an inner PJRT_CopyToDeviceStream that FlexNPU cannot offer:
// refused by name before anything runs, and the executable still runs without them.
TEST_F(CApiVirtualizationTest, RecvCallbacksAreRefusedByName) {
  PJRT_Client* client = CreateClient(4);
  PJRT_LoadedExecutable* exe = nullptr;
  ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(1), &exe).code, PJRT_Error_Code_OK);
  PJRT_Buffer* a = Upload(client, Device(client, 1), {1, 2, 3, 4});
  PJRT_RecvCallbackInfo recv{};
  PJRT_RecvCallbackInfo* recv_list = &recv;
  CallShape with_recv;
  with_recv.recv_callbacks = &recv_list;
  with_recv.num_recv_ops = 1;
  std::vector<PJRT_Buffer*> outputs;
  ErrorInfo info = ExecuteOnDevices(exe, {{a, a}}, 1, &outputs, /*await=*/true, nullptr,
                                    with_recv);
  EXPECT_EQ(info.code, PJRT_Error_Code_UNIMPLEMENTED);
  EXPECT_NE(info.message.find("recv callbacks (num_recv_ops > 0)"), std::string::npos)
      << info.message;
  EXPECT_EQ(outputs[0], nullptr);
  PJRT_Buffer* out = nullptr;
  ASSERT_EQ(Execute(exe, {a, a}, &out).code, PJRT_Error_Code_OK);
  EXPECT_EQ(Download(out, 4), (std::vector<float>{2, 8, 18, 32}));
  DestroyBuffer(out);
}

TEST_F(CApiVirtualizationTest, MemoryStatsWritesOnlyWhatTheCallerStructHolds) {
  PJRT_Client* client = CreateClient(4);
  // An older caller's struct ends at largest_alloc_size_is_set; what follows is not its.
  const size_t size = offsetof(PJRT_Device_MemoryStats_Args, largest_alloc_size_is_set) + 1;
  std::vector<unsigned char> storage(sizeof(PJRT_Device_MemoryStats_Args) + 64, 0xAB);
  auto* stats = reinterpret_cast<PJRT_Device_MemoryStats_Args*>(storage.data());
  stats->struct_size = size;
  stats->extension_start = nullptr;
  stats->device = Device(client, 0);
  ASSERT_PJRT_OK(api->PJRT_Device_MemoryStats(stats));
  EXPECT_TRUE(stats->largest_alloc_size_is_set);
  for (size_t i = size; i < storage.size(); ++i) {
    ASSERT_EQ(storage[i], 0xAB) << "byte " << i << " past the caller's struct_size " << size;
  }
  // A full struct gets the limit.
  PJRT_Device_MemoryStats_Args full{};
  full.struct_size = PJRT_Device_MemoryStats_Args_STRUCT_SIZE;
  full.device = Device(client, 0);
  ASSERT_PJRT_OK(api->PJRT_Device_MemoryStats(&full));
  EXPECT_TRUE(full.bytes_limit_is_set);
  EXPECT_GT(full.bytes_limit, 0);
}

TEST_F(CApiVirtualizationTest, VirtualDevicesShareThePhysicalMemory) {
  // 6 virtual devices over the 4 CPU devices (the default): the CPU devices split the host's
  // RAM, virtual devices 0 and 4 (homed on physical 0) and 1 and 5 split theirs.
  const int64_t host = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  PJRT_Client* client = CreateClient(6);
  std::vector<int64_t> limits;
  for (int v = 0; v < 6; ++v) {
    PJRT_Device_MemoryStats_Args stats{};
    stats.struct_size = PJRT_Device_MemoryStats_Args_STRUCT_SIZE;
    stats.device = Device(client, v);
    ASSERT_PJRT_OK(api->PJRT_Device_MemoryStats(&stats));
    ASSERT_TRUE(stats.bytes_limit_is_set) << "device " << v;
    EXPECT_EQ(stats.bytes_reservable_limit, stats.bytes_limit) << "device " << v;
    limits.push_back(stats.bytes_limit);
  }
  int64_t sum = 0;
  for (int64_t limit : limits) sum += limit;
  EXPECT_EQ(sum, host);
  const int64_t per_physical = host / 4;
  EXPECT_LE(std::abs(limits[0] + limits[4] - per_physical), 1);
  EXPECT_LE(std::abs(limits[1] + limits[5] - per_physical), 1);
  EXPECT_LE(std::abs(limits[2] - per_physical), 1);
  EXPECT_LE(std::abs(limits[0] - per_physical / 2), 1);
}

TEST_F(CApiVirtualizationTest, ArgumentStructsLargerThanTheHeaderAreAccepted) {
  PJRT_Client* client = CreateClient(4);
  PJRT_Buffer* buffer = Upload(client, Device(client, 3), {5, 6, 7, 8});
  // A caller built against a newer header passes a larger struct (zeroed tail).
  std::vector<unsigned char> storage(sizeof(PJRT_Buffer_Dimensions_Args) + 64, 0);
  auto* dims = reinterpret_cast<PJRT_Buffer_Dimensions_Args*>(storage.data());
  dims->struct_size = storage.size();
  dims->buffer = buffer;
  ASSERT_PJRT_OK(api->PJRT_Buffer_Dimensions(dims));
  ASSERT_EQ(dims->num_dims, 1u);
  EXPECT_EQ(dims->dims[0], 4);

  std::vector<unsigned char> layout_storage(sizeof(PJRT_Buffer_GetMemoryLayout_Args) + 64, 0);
  auto* layout = reinterpret_cast<PJRT_Buffer_GetMemoryLayout_Args*>(layout_storage.data());
  layout->struct_size = layout_storage.size();
  layout->buffer = buffer;
  ASSERT_PJRT_OK(api->PJRT_Buffer_GetMemoryLayout(layout));
  EXPECT_EQ(layout->struct_size, layout_storage.size());
  EXPECT_EQ(layout->layout.tiled.minor_to_major_size, 1u);
}

TEST_F(CApiVirtualizationTest, ErrorMessageFillsWhatTheStructHolds) {
  PJRT_Client* client = CreateClient(4);
  PJRT_Client_LookupDevice_Args lookup{};
  lookup.struct_size = PJRT_Client_LookupDevice_Args_STRUCT_SIZE;
  lookup.client = client;
  lookup.id = 99;
  PJRT_Error* error = api->PJRT_Client_LookupDevice(&lookup);
  ASSERT_NE(error, nullptr);
  // A struct that ends after `message`: message is set, the missing size is not written.
  PJRT_Error_Message_Args m{};
  m.struct_size = offsetof(PJRT_Error_Message_Args, message) + sizeof(m.message);
  m.error = error;
  m.message = reinterpret_cast<const char*>(0x1);
  m.message_size = 12345;
  api->PJRT_Error_Message(&m);
  ASSERT_NE(m.message, reinterpret_cast<const char*>(0x1));
  EXPECT_NE(std::string(m.message).find("no virtual device with id 99"), std::string::npos)
      << m.message;
  EXPECT_EQ(m.message_size, 12345u);
  // Without an error: an empty message, never an unset pointer.
  PJRT_Error_Message_Args none{};
  none.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE;
  none.error = nullptr;
  none.message = reinterpret_cast<const char*>(0x1);
  api->PJRT_Error_Message(&none);
  EXPECT_STREQ(none.message, "");
  EXPECT_EQ(none.message_size, 0u);
  Info(error);
}

TEST_F(CApiVirtualizationTest, MalformedCreateOptionsAreRejected) {
  PJRT_Client* client = nullptr;
  PJRT_NamedValue unnamed = IntOption("num_virtual_devices", 2);
  unnamed.name = nullptr;
  ErrorInfo info = TryCreateClient({unnamed}, &client);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("has no name"), std::string::npos) << info.message;

  PJRT_NamedValue no_value = StringOption("policy", "dynamic");
  no_value.string_value = nullptr;
  info = TryCreateClient({no_value}, &client);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("option 'policy' has a null string value"), std::string::npos)
      << info.message;

  PJRT_NamedValue small = IntOption("num_virtual_devices", 2);
  small.struct_size = 8;
  info = TryCreateClient({small}, &client);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("struct_size 8, too small"), std::string::npos) << info.message;
}

TEST_F(CApiVirtualizationTest, MalformedProgramsAndHostBuffersAreRejected) {
  PJRT_Client* client = CreateClient(4);
  const std::string options = CompileOptionsFor(0);
  std::string code = kAddProgram;
  PJRT_Program program{};
  program.struct_size = PJRT_Program_STRUCT_SIZE;
  program.code = code.data();
  program.code_size = code.size();
  program.format = nullptr;
  program.format_size = 4;
  PJRT_Client_Compile_Args compile{};
  compile.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE;
  compile.client = client;
  compile.program = &program;
  compile.compile_options = options.data();
  compile.compile_options_size = options.size();
  ErrorInfo info = Info(api->PJRT_Client_Compile(&compile));
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("program format is null"), std::string::npos) << info.message;
  program.format = "mlir";
  program.struct_size = 8;
  info = Info(api->PJRT_Client_Compile(&compile));
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("program struct_size 8 is too small"), std::string::npos)
      << info.message;

  const int64_t dims[] = {4};
  const int64_t strides[] = {4, 16};
  PJRT_Client_BufferFromHostBuffer_Args upload{};
  upload.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
  upload.client = client;
  upload.data = nullptr;
  upload.type = PJRT_Buffer_Type_F32;
  upload.dims = dims;
  upload.num_dims = 1;
  upload.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
  upload.device = Device(client, 0);
  info = Info(api->PJRT_Client_BufferFromHostBuffer(&upload));
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("data is null for 4 elements"), std::string::npos) << info.message;
  const float data[4] = {1, 2, 3, 4};
  upload.data = data;
  upload.byte_strides = strides;
  upload.num_byte_strides = 2;
  info = Info(api->PJRT_Client_BufferFromHostBuffer(&upload));
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("2 byte_strides for 1 dims"), std::string::npos) << info.message;
}

TEST_F(CApiVirtualizationTest, OnReadyCallbackMayDestroyItsEvent) {
  PJRT_Client* client = CreateClient(4);
  PJRT_LoadedExecutable* exe = nullptr;
  ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(1), &exe).code, PJRT_Error_Code_OK);
  PJRT_Buffer* a = Upload(client, Device(client, 1), {1, 2, 3, 4});
  for (int i = 0; i < 20; ++i) {
    PJRT_Buffer* const* argument_list = &a;
    PJRT_Buffer* const arguments[2] = {a, a};
    argument_list = arguments;
    PJRT_Buffer* outputs[1] = {nullptr};
    PJRT_Buffer** output_list = outputs;
    PJRT_Event* done = nullptr;
    PJRT_LoadedExecutable_Execute_Args args{};
    args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
    args.executable = exe;
    args.argument_lists = &argument_list;
    args.num_devices = 1;
    args.num_args = 2;
    args.output_lists = &output_list;
    args.device_complete_events = &done;
    ASSERT_PJRT_OK(api->PJRT_LoadedExecutable_Execute(&args));
    struct Context {
      PJRT_Event* event;
      std::promise<PJRT_Error_Code> code;
    } context{done, {}};
    std::future<PJRT_Error_Code> result = context.code.get_future();
    PJRT_Event_OnReady_Args on_ready{};
    on_ready.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE;
    on_ready.event = done;
    on_ready.user_arg = &context;
    on_ready.callback = [](PJRT_Error* error, void* arg) {
      auto* c = static_cast<Context*>(arg);
      // JAX's pattern: the callback destroys the event it was registered on.
      PJRT_Event_Destroy_Args destroy{};
      destroy.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
      destroy.event = c->event;
      PJRT_Error* destroy_error = api->PJRT_Event_Destroy(&destroy);
      c->code.set_value(error == nullptr && destroy_error == nullptr ? PJRT_Error_Code_OK
                                                                     : PJRT_Error_Code_INTERNAL);
      Info(error);
      Info(destroy_error);
    };
    ASSERT_PJRT_OK(api->PJRT_Event_OnReady(&on_ready));
    EXPECT_EQ(result.get(), PJRT_Error_Code_OK);
    EXPECT_EQ(Download(outputs[0], 4), (std::vector<float>{2, 8, 18, 32}));
    DestroyBuffer(outputs[0]);
  }
}

// A thread that exits inside an OnReady callback (pthread_exit: the forced unwind a cancelled
// or exiting thread goes through) on an event that is already ready, so the callback runs
// within PJRT_Event_OnReady, under FlexNPU's entry-point guard and its inner-callback wrapper.
// The unwind must pass through both: swallowed by a catch (...), glibc aborts the process
// ("FATAL: exception not rethrown"); through a noexcept frame, std::terminate. Run in a child
// process (death test): exit code 0 only if the thread really ended inside the callback.
void ExitInsideOnReadyCallback(CApiVirtualizationTest* test) {
  PJRT_Client* client = test->CreateClient(4);
  PJRT_Buffer* buffer = test->Upload(client, test->Device(client, 0), {1, 2, 3, 4});
  PJRT_Buffer_ReadyEvent_Args ready{};
  ready.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
  ready.buffer = buffer;
  if (Info(api->PJRT_Buffer_ReadyEvent(&ready)).code != PJRT_Error_Code_OK) std::_Exit(2);
  PJRT_Event_Await_Args await{};
  await.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
  await.event = ready.event;
  if (Info(api->PJRT_Event_Await(&await)).code != PJRT_Error_Code_OK) std::_Exit(2);
  struct State {
    PJRT_Event* event;
    pthread_t thread;
    std::atomic<bool> ran_on_caller{false}, ran_elsewhere{false}, returned{false};
  } state;
  state.event = ready.event;
  auto body = [](void* arg) -> void* {
    auto* st = static_cast<State*>(arg);
    st->thread = pthread_self();
    PJRT_Event_OnReady_Args on_ready{};
    on_ready.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE;
    on_ready.event = st->event;
    on_ready.user_arg = st;
    on_ready.callback = [](PJRT_Error* error, void* user_arg) {
      auto* s = static_cast<State*>(user_arg);
      Info(error);
      if (!pthread_equal(pthread_self(), s->thread)) {
        s->ran_elsewhere = true;
        return;
      }
      s->ran_on_caller = true;
      pthread_exit(nullptr);
    };
    Info(api->PJRT_Event_OnReady(&on_ready));
    st->returned = true;  // only reached if the callback did not end the thread
    return nullptr;
  };
  pthread_t thread;
  if (pthread_create(&thread, nullptr, body, &state) != 0) std::_Exit(2);
  pthread_join(thread, nullptr);
  if (state.ran_elsewhere) std::_Exit(3);  // the backend deferred the callback: not tested
  if (!state.ran_on_caller || state.returned) std::_Exit(4);
  std::_Exit(0);
}

TEST_F(CApiVirtualizationTest, ThreadExitInsideACallbackUnwindsThroughFlexNpu) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(ExitInsideOnReadyCallback(this), ::testing::ExitedWithCode(0), "");
}

TEST_F(CApiVirtualizationTest, ExecutionsRaceBufferDestructionAndPolicySwitches) {
  PJRT_Client* client = CreateClientWith({IntOption("num_virtual_devices", 8),
                                          StringOption("policy", "dynamic")});
  ASSERT_NE(client, nullptr);
  auto set_policy =
      reinterpret_cast<const char* (*)(const char*)>(dlsym(plugin_library, "FlexNpu_SetPolicy"));
  ASSERT_NE(set_policy, nullptr);
  std::vector<PJRT_LoadedExecutable*> executables;
  for (int v = 0; v < 8; ++v) {
    PJRT_LoadedExecutable* exe = nullptr;
    ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(v), &exe).code,
              PJRT_Error_Code_OK);
    executables.push_back(exe);
  }
  std::atomic<bool> running{true};
  std::atomic<int64_t> wrong{0}, errors{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 60; ++i) {
        const int v = (2 * k + i) % 8;
        // Each thread's own inputs, destroyed right after the (asynchronous) execution.
        PJRT_Buffer* a = nullptr;
        {
          const int64_t dims[] = {4};
          const float data[4] = {1.0f * v, 1, 2, 3};
          PJRT_Client_BufferFromHostBuffer_Args args{};
          args.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
          args.client = client;
          args.data = data;
          args.type = PJRT_Buffer_Type_F32;
          args.dims = dims;
          args.num_dims = 1;
          args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
          args.device = Device(client, (v + i) % 8);  // often not where the program runs
          if (Info(api->PJRT_Client_BufferFromHostBuffer(&args)).code != 0) {
            ++errors;
            continue;
          }
          if (args.done_with_host_buffer != nullptr) Await(args.done_with_host_buffer);
          a = args.buffer;
        }
        PJRT_Buffer* out = nullptr;
        ErrorInfo info = Execute(executables[v], {a, a}, &out, /*await=*/false);
        DestroyBuffer(a);
        if (info.code != PJRT_Error_Code_OK) {
          // Committed to another virtual device: JAX would not send it; FlexNPU moves it.
          ++errors;
          continue;
        }
        std::vector<float> got = Download(out, 4);
        const float x = 1.0f * v;
        wrong += got != std::vector<float>{(x + x) * x, 2, 8, 18};
        DestroyBuffer(out);
      }
    });
  }
  std::thread switcher([&] {
    for (int i = 0; running.load() && i < 200; ++i) {
      const char* error = set_policy(i % 2 ? "passthrough" : "dynamic");
      if (error != nullptr && *error != '\0') ++errors;
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  running = false;
  switcher.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
}

// single_device_compile=auto under a placing policy: an execution placed off its home device
// runs a variant pinned to that device, made once on the first placement there (before, one
// portable compile served every device, a slower execute path), with the right results. The
// devices are all of one kind: the variants are loaded from the first compile, not compiled.
TEST_F(CApiVirtualizationTest, OffHomeExecutionsRunAVariantPinnedPerDevice) {
  PJRT_Client* client = CreateClientWith(
      {IntOption("num_virtual_devices", 4), StringOption("policy", "dynamic")});
  ASSERT_NE(client, nullptr);
  PJRT_LoadedExecutable* exe = nullptr;
  ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(0), &exe).code, PJRT_Error_Code_OK);
  const int64_t compiles = StatOfFirstClient("backend_compiles");
  ASSERT_GE(compiles, 1) << "no 'backend_compiles' in the stats";
  const int64_t shared = StatOfFirstClient("shared_loads");
  ASSERT_GE(shared, 0) << "no 'shared_loads' in the stats";
  for (int round = 0; round < 3; ++round) {
    for (int k = 1; k < 4; ++k) {
      const float x = static_cast<float>(k + round);
      PJRT_Buffer* input = Upload(client, Device(client, k), {x, x + 1, x + 2, x + 3});
      std::vector<PJRT_Buffer*> outputs;
      ErrorInfo info = ExecuteOnDevices(exe, {{input, input}}, 1, &outputs, /*await=*/true,
                                        Device(client, k));
      ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
      EXPECT_EQ(Download(outputs[0], 4),
                (std::vector<float>{2 * x * x, 2 * (x + 1) * (x + 1), 2 * (x + 2) * (x + 2),
                                    2 * (x + 3) * (x + 3)}))
          << "on device " << k;
      DestroyBuffer(outputs[0]);
    }
    // One pinned variant per device placed on, loaded on the first placement there only.
    EXPECT_EQ(StatOfFirstClient("shared_loads"), shared + 3) << "round " << round;
    EXPECT_EQ(StatOfFirstClient("backend_compiles"), compiles) << "round " << round;
  }
  EXPECT_EQ(StatOfFirstClient("migrations"), 0) << "executions followed their data";
}

// A single-device execution whose caller asks for no completion events, or passes options of
// an older or a newer header, under the placing policy (tracked: FlexNPU asks the backend for
// the event itself and releases it after the placer's callback): results right, each counted.
TEST_F(CApiVirtualizationTest, SingleDeviceRunsRightWithoutCallerEventsAndWithAnyOptionsSize) {
  PJRT_Client* client = CreateClientWith(
      {IntOption("num_virtual_devices", 8), StringOption("policy", "dynamic")});
  ASSERT_NE(client, nullptr);
  PJRT_LoadedExecutable* exe = nullptr;
  ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(5), &exe).code, PJRT_Error_Code_OK);
  PJRT_Buffer* a = Upload(client, Device(client, 5), {1, 2, 3, 4});
  PJRT_Buffer* b = Upload(client, Device(client, 5), {1, 1, 1, 1});
  const int64_t executions = StatOfFirstClient("executions");
  int runs = 0;
  for (size_t options_size : {offsetof(PJRT_ExecuteOptions, context),
                              size_t{PJRT_ExecuteOptions_STRUCT_SIZE},
                              sizeof(PJRT_ExecuteOptions) + 128}) {
    for (bool events : {false, true}) {
      std::vector<PJRT_Buffer*> outputs;
      ErrorInfo info = ExecuteOnDevices(exe, {{a, b}}, 1, &outputs, /*await=*/true, nullptr,
                                        CallShape{options_size, events});
      ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
      EXPECT_EQ(Download(outputs[0], 4), (std::vector<float>{2, 3, 4, 5}))
          << "options size " << options_size << (events ? ", events" : ", no events");
      DestroyBuffer(outputs[0]);
      ++runs;
    }
  }
  EXPECT_EQ(StatOfFirstClient("executions"), executions + runs);
}

// The executions counter is sharded per thread: more threads than shards, every execution
// counted once.
TEST_F(CApiVirtualizationTest, ExecutionsAreCountedOnceOnEveryThread) {
  PJRT_Client* client = CreateClient(4);
  ASSERT_NE(client, nullptr);
  PJRT_LoadedExecutable* exe = nullptr;
  ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(1), &exe).code, PJRT_Error_Code_OK);
  PJRT_Buffer* a = Upload(client, Device(client, 1), {1, 2, 3, 4});
  PJRT_Buffer* b = Upload(client, Device(client, 1), {1, 1, 1, 1});
  const int64_t before = StatOfFirstClient("executions");
  ASSERT_GE(before, 0);
  constexpr int kThreads = 20;  // more than the counter's 16 shards
  constexpr int kCalls = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) {
        PJRT_Buffer* output = nullptr;
        ErrorInfo info = Execute(exe, {a, b}, &output);
        EXPECT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
        if (output != nullptr) DestroyBuffer(output);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(StatOfFirstClient("executions") - before, kThreads * kCalls);
}

// single_device_compile=auto under a placing policy, over a backend that fails to compile the
// variant pinned to the first device an execution is placed on off home: that execution runs
// the portable compile on the device it was placed on instead (the fallback), with the right
// result; the next device off home gets its pinned variant as usual.
TEST_F(CApiVirtualizationTest, AFailedPinnedCompileFallsBackToThePortableOne) {
  const std::string fake = Backend("fake_backend_second_compile_fails.so");
  if (fake.empty()) GTEST_SKIP() << "FLEXNPU_TEST_FAKE_BACKEND_DIR not set";
  setenv("FLEXNPU_FAKE_INNER_PLUGIN", Env("FLEXNPU_CPU_PLUGIN_PATH").c_str(), 1);
  PJRT_Client* client = CreateClientWith(
      {StringOption("backend", fake), IntOption("num_virtual_devices", 4),
       StringOption("policy", "dynamic"), StringOption("single_device_compile", "auto"),
       StringOption("share_compiles", "false")});
  ASSERT_NE(client, nullptr);
  PJRT_LoadedExecutable* exe = nullptr;
  // The backend's first compile: the initial variant, pinned to device 0's home.
  ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(0), &exe).code, PJRT_Error_Code_OK);
  const int64_t compiles = StatOfFirstClient("backend_compiles");
  ASSERT_GE(compiles, 1) << "no 'backend_compiles' in the stats";
  auto run_on = [&](int k, float x) {
    PJRT_Buffer* input = Upload(client, Device(client, k), {x, x + 1, x + 2, x + 3});
    std::vector<PJRT_Buffer*> outputs;
    ErrorInfo info = ExecuteOnDevices(exe, {{input, input}}, 1, &outputs, /*await=*/true,
                                      Device(client, k));
    ASSERT_EQ(info.code, PJRT_Error_Code_OK) << "on device " << k << ": " << info.message;
    EXPECT_EQ(Download(outputs[0], 4),
              (std::vector<float>{2 * x * x, 2 * (x + 1) * (x + 1), 2 * (x + 2) * (x + 2),
                                  2 * (x + 3) * (x + 3)}))
        << "on device " << k;
    DestroyBuffer(outputs[0]);
  };
  // Device 1: the pinned compile (the backend's second) fails, the portable one runs there.
  run_on(1, 1.0f);
  EXPECT_EQ(StatOfFirstClient("backend_compiles"), compiles + 1) << "the portable compile";
  EXPECT_EQ(StatOfFirstClient("migrations"), 0) << "it ran where its data was";
  // Device 2: its pinned variant compiles.
  run_on(2, 5.0f);
  EXPECT_EQ(StatOfFirstClient("backend_compiles"), compiles + 2) << "device 2's pinned variant";
  // Device 1 again, several times: right again, on the portable variant remembered for it;
  // its pinned compile, failed once, is not tried again (the fake's next compile would pass).
  for (float x : {9.0f, 13.0f, 17.0f}) run_on(1, x);
  EXPECT_EQ(StatOfFirstClient("backend_compiles"), compiles + 2)
      << "device 1's failed pinned compile was tried again";
  EXPECT_EQ(StatOfFirstClient("migrations"), 0);
}

// A program run on more physical devices than the compiled-variants cache keeps (16 mappings
// besides the initial one, least recently used evicted): evicted variants are compiled again
// when needed, cached ones are not, and every execution computes the right result.
TEST_F(CApiVirtualizationTest, EvictedMappingsAreCompiledAgainWithRightResults) {
  constexpr int kDevices = 20;
  PJRT_Client* client = CreateClientWith(
      {IntOption("num_virtual_devices", kDevices),
       StringOption("backend_options", "cpu_device_count=" + std::to_string(kDevices)),
       StringOption("single_device_compile", "pinned"), StringOption("share_compiles", "false")});
  ASSERT_NE(client, nullptr);
  PJRT_LoadedExecutable* exe = nullptr;
  ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(0), &exe).code, PJRT_Error_Code_OK);
  std::vector<PJRT_Buffer*> inputs;
  for (int k = 0; k < kDevices; ++k) {
    const float x = static_cast<float>(k);
    inputs.push_back(Upload(client, Device(client, k), {x, x + 1, x + 2, x + 3}));
  }
  // Runs on virtual device k (physical k under passthrough): pinned, one variant per device.
  auto run_on = [&](int k) {
    std::vector<PJRT_Buffer*> outputs;
    ErrorInfo info = ExecuteOnDevices(exe, {{inputs[k], inputs[k]}}, 1, &outputs,
                                      /*await=*/true, Device(client, k));
    ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    const float x = static_cast<float>(k);
    EXPECT_EQ(Download(outputs[0], 4),
              (std::vector<float>{2 * x * x, 2 * (x + 1) * (x + 1), 2 * (x + 2) * (x + 2),
                                  2 * (x + 3) * (x + 3)}))
        << "on device " << k;
    PJRT_Buffer_Device_Args device{};
    device.struct_size = PJRT_Buffer_Device_Args_STRUCT_SIZE;
    device.buffer = outputs[0];
    ASSERT_PJRT_OK(api->PJRT_Buffer_Device(&device));
    EXPECT_EQ(device.device, Device(client, k));
    DestroyBuffer(outputs[0]);
  };
  const int64_t compiles = StatOfFirstClient("backend_compiles");
  ASSERT_GE(compiles, 1) << "no 'backend_compiles' in the stats";
  for (int k = 1; k < kDevices; ++k) run_on(k);
  // 19 mappings besides the initial one: 1, 2 and 3 were evicted to keep 16.
  EXPECT_EQ(StatOfFirstClient("backend_compiles"), compiles + 19);
  run_on(19);
  run_on(4);
  run_on(0);  // the initial variant is never evicted
  EXPECT_EQ(StatOfFirstClient("backend_compiles"), compiles + 19) << "cached variants recompiled";
  run_on(1);  // evicted: compiled again (evicting 5, now the least recently used)
  run_on(2);
  run_on(1);
  EXPECT_EQ(StatOfFirstClient("backend_compiles"), compiles + 21);
  run_on(5);
  EXPECT_EQ(StatOfFirstClient("backend_compiles"), compiles + 22);
}

// A program that returns a token (jax.jit of lax.create_token): FlexNPU learns the outputs'
// metadata from the first execution and must not ask the backend for a token's dynamic
// dimensions (the CPU plugin CHECK-fails and aborts the process; JAX's api_test
// test_jit_capturing_token died so on flexnpu).
TEST_F(CApiVirtualizationTest, ProgramsReturningATokenRun) {
  constexpr char kTokenProgram[] = R"(
module @token attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main() -> !stablehlo.token {
    %0 = stablehlo.after_all : !stablehlo.token
    return %0 : !stablehlo.token
  }
})";
  for (const char* policy : {"passthrough", "dynamic"}) {
    PJRT_Client* client = CreateClientWith(
        {IntOption("num_virtual_devices", 8), StringOption("policy", policy)});
    ASSERT_NE(client, nullptr);
    PJRT_LoadedExecutable* exe = nullptr;
    ErrorInfo info = TryCompile(client, kTokenProgram, CompileOptionsFor(5), &exe);
    ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    for (int i = 0; i < 2; ++i) {
      std::vector<PJRT_Buffer*> outputs;
      info = ExecuteOnDevices(exe, {{}}, 1, &outputs);
      ASSERT_EQ(info.code, PJRT_Error_Code_OK) << policy << ": " << info.message;
      PJRT_Buffer_ElementType_Args type{};
      type.struct_size = PJRT_Buffer_ElementType_Args_STRUCT_SIZE;
      type.buffer = outputs[0];
      ASSERT_PJRT_OK(api->PJRT_Buffer_ElementType(&type));
      EXPECT_EQ(type.type, PJRT_Buffer_Type_TOKEN) << policy;
      DestroyBuffer(outputs[0]);
    }
  }
}

TEST_F(CApiVirtualizationTest, DestroyedExecutablesAreForgottenByThePlacer) {
  PJRT_Client* client = CreateClientWith({IntOption("num_virtual_devices", 8),
                                          StringOption("policy", "dynamic")});
  ASSERT_NE(client, nullptr);
  PJRT_Buffer* a = Upload(client, Device(client, 2), {1, 2, 3, 4});
  const int64_t before = StatOfFirstClient("executables");
  ASSERT_GE(before, 0) << "no 'executables' in the placement stats";
  std::vector<PJRT_LoadedExecutable*> compiled;
  for (int i = 0; i < 5; ++i) {
    PJRT_LoadedExecutable* exe = nullptr;
    ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(2), &exe).code,
              PJRT_Error_Code_OK);
    PJRT_Buffer* out = nullptr;
    ASSERT_EQ(Execute(exe, {a, a}, &out).code, PJRT_Error_Code_OK);
    DestroyBuffer(out);
    compiled.push_back(exe);
  }
  EXPECT_EQ(StatOfFirstClient("executables"), before + 5);
  for (PJRT_LoadedExecutable* exe : compiled) {
    PJRT_LoadedExecutable_Destroy_Args destroy{};
    destroy.struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE;
    destroy.executable = exe;
    ASSERT_PJRT_OK(api->PJRT_LoadedExecutable_Destroy(&destroy));
    executables_.erase(std::find(executables_.begin(), executables_.end(), exe));
  }
  EXPECT_EQ(StatOfFirstClient("executables"), before);
}

TEST_F(CApiVirtualizationTest, PluginAttributesAreFlexNpusOwn) {
  PJRT_Plugin_Attributes_Args args{};
  args.struct_size = PJRT_Plugin_Attributes_Args_STRUCT_SIZE;
  ASSERT_PJRT_OK(api->PJRT_Plugin_Attributes(&args));
  // Known before any client exists (FLEXNPU_CPU_PLUGIN_PATH names the backend), and only the
  // program-format versions of the backend, nothing FlexNPU does not itself offer.
  bool has_stablehlo = false;
  for (size_t i = 0; i < args.num_attributes; ++i) {
    const std::string name(args.attributes[i].name, args.attributes[i].name_size);
    EXPECT_TRUE(name == "xla_version" || name == "stablehlo_current_version" ||
                name == "stablehlo_minimum_version")
        << name;
    if (name == "stablehlo_current_version") {
      has_stablehlo = true;
      EXPECT_EQ(args.attributes[i].type, PJRT_NamedValue_kInt64List);
      EXPECT_EQ(args.attributes[i].value_size, 3u);
    }
  }
  EXPECT_TRUE(has_stablehlo);
  // The same answer with clients alive: it is stable, not the newest client's.
  CreateClient(4);
  PJRT_Plugin_Attributes_Args again{};
  again.struct_size = PJRT_Plugin_Attributes_Args_STRUCT_SIZE;
  ASSERT_PJRT_OK(api->PJRT_Plugin_Attributes(&again));
  EXPECT_EQ(again.attributes, args.attributes);
  EXPECT_EQ(again.num_attributes, args.num_attributes);
}

TEST_F(CApiVirtualizationTest, NewerInnerMinorVersionNeedsAnOptIn) {
  const std::string newer = Backend("fake_backend_newer_minor.so");
  if (newer.empty()) GTEST_SKIP() << "FLEXNPU_TEST_FAKE_BACKEND_DIR not set";
  setenv("FLEXNPU_FAKE_INNER_PLUGIN", Env("FLEXNPU_CPU_PLUGIN_PATH").c_str(), 1);
  PJRT_Client* client = nullptr;
  ErrorInfo info = TryCreateClient({StringOption("backend", newer)}, &client);
  EXPECT_EQ(info.code, PJRT_Error_Code_FAILED_PRECONDITION);
  EXPECT_NE(info.message.find("PJRT C API 0." + std::to_string(PJRT_API_MINOR + 1) +
                              ", newer than FlexNPU's 0." + std::to_string(PJRT_API_MINOR)),
            std::string::npos)
      << info.message;
  EXPECT_NE(info.message.find("allow_newer_backend=true"), std::string::npos) << info.message;

  PJRT_NamedValue allow{};
  allow.struct_size = PJRT_NamedValue_STRUCT_SIZE;
  allow.name = "allow_newer_backend";
  allow.name_size = std::strlen(allow.name);
  allow.type = PJRT_NamedValue_kBool;
  allow.bool_value = true;
  allow.value_size = 1;
  info = TryCreateClient({StringOption("backend", newer), allow}, &client);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  PJRT_LoadedExecutable* exe = nullptr;
  ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(0), &exe).code, PJRT_Error_Code_OK);
  PJRT_Buffer* a = Upload(client, Device(client, 0), {1, 2, 3, 4});
  PJRT_Buffer* out = nullptr;
  ASSERT_EQ(Execute(exe, {a, a}, &out).code, PJRT_Error_Code_OK);
  buffers_.push_back(out);
  EXPECT_EQ(Download(out, 4), (std::vector<float>{2, 8, 18, 32}));
}

// The backend succeeds at a transfer or an execution, then fails a metadata query FlexNPU needs
// to wrap the result: the call fails, hands out no event or buffer, and the transfer is done
// with the host data before it returns (the caller may free it then).
TEST_F(CApiVirtualizationTest, FailuresAfterTheInnerCallHandOutNothing) {
  const std::string failing = Backend("fake_backend_failing_size.so");
  if (failing.empty()) GTEST_SKIP() << "FLEXNPU_TEST_FAKE_BACKEND_DIR not set";
  setenv("FLEXNPU_FAKE_INNER_PLUGIN", Env("FLEXNPU_CPU_PLUGIN_PATH").c_str(), 1);
  PJRT_Client* client = CreateClientWith({StringOption("backend", failing)});
  ASSERT_NE(client, nullptr);

  auto data = std::make_unique<std::vector<float>>(std::vector<float>{1, 2, 3, 4});
  const int64_t dims[] = {4};
  PJRT_Client_BufferFromHostBuffer_Args upload{};
  upload.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
  upload.client = client;
  upload.data = data->data();
  upload.type = PJRT_Buffer_Type_F32;
  upload.dims = dims;
  upload.num_dims = 1;
  upload.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
  upload.device = Device(client, 0);
  ErrorInfo info = Info(api->PJRT_Client_BufferFromHostBuffer(&upload));
  EXPECT_EQ(info.code, PJRT_Error_Code_UNAVAILABLE);
  EXPECT_NE(info.message.find("PJRT_Buffer_OnDeviceSizeInBytes: fake backend: on-device size "
                              "unavailable"),
            std::string::npos)
      << info.message;
  EXPECT_EQ(upload.done_with_host_buffer, nullptr);
  data.reset();  // under ASan: a transfer still reading it would be a use-after-free

  PJRT_LoadedExecutable* exe = nullptr;
  ASSERT_EQ(TryCompile(client, kConstantProgram, CompileOptionsFor(0), &exe).code,
            PJRT_Error_Code_OK);
  PJRT_Buffer* outputs[1] = {nullptr};
  PJRT_Buffer** output_list = outputs;
  PJRT_Event* done = nullptr;
  PJRT_LoadedExecutable_Execute_Args args{};
  args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  args.executable = exe;
  args.num_devices = 1;
  args.output_lists = &output_list;
  args.device_complete_events = &done;
  info = Info(api->PJRT_LoadedExecutable_Execute(&args));
  EXPECT_EQ(info.code, PJRT_Error_Code_UNAVAILABLE) << info.message;
  // Nothing the caller would have to destroy (LSan reports a leaked event otherwise).
  EXPECT_EQ(done, nullptr);
  EXPECT_EQ(outputs[0], nullptr);
}

// The lammps-jax-pjrt-cpu plugin (PJRT C API 0.115) when it is installed.
TEST_F(CApiVirtualizationTest, RealNewerPluginIsRejectedByDefault) {
  const std::string lammps = Env("FLEXNPU_TEST_NEWER_PLUGIN");
  if (lammps.empty()) GTEST_SKIP() << "FLEXNPU_TEST_NEWER_PLUGIN not set";
  PJRT_Client* client = nullptr;
  ErrorInfo info = TryCreateClient({StringOption("backend", lammps)}, &client);
  EXPECT_EQ(info.code, PJRT_Error_Code_FAILED_PRECONDITION);
  EXPECT_NE(info.message.find("newer than FlexNPU's 0." + std::to_string(PJRT_API_MINOR)),
            std::string::npos)
      << info.message;
}

TEST_F(CApiVirtualizationTest, MissingInnerSlotIsUnimplemented) {
  const std::string partial = Backend("fake_backend_missing_slots.so");
  if (partial.empty()) GTEST_SKIP() << "FLEXNPU_TEST_FAKE_BACKEND_DIR not set";
  setenv("FLEXNPU_FAKE_INNER_PLUGIN", Env("FLEXNPU_CPU_PLUGIN_PATH").c_str(), 1);
  PJRT_Client* client = CreateClientWith({StringOption("backend", partial)});
  ASSERT_NE(client, nullptr);
  PJRT_Buffer* a = Upload(client, Device(client, 0), {1, 2, 3, 4});
  PJRT_Buffer_UnpaddedDimensions_Args dims{};
  dims.struct_size = PJRT_Buffer_UnpaddedDimensions_Args_STRUCT_SIZE;
  dims.buffer = a;
  ErrorInfo info = Info(api->PJRT_Buffer_UnpaddedDimensions(&dims));
  EXPECT_EQ(info.code, PJRT_Error_Code_UNIMPLEMENTED);
  EXPECT_NE(info.message.find("PJRT_Buffer_UnpaddedDimensions is not provided by the physical "
                              "backend"),
            std::string::npos)
      << info.message;
  PJRT_LoadedExecutable* exe = nullptr;
  ASSERT_EQ(TryCompile(client, kAddProgram, CompileOptionsFor(0), &exe).code, PJRT_Error_Code_OK);
  PJRT_LoadedExecutable_Fingerprint_Args fingerprint{};
  fingerprint.struct_size = PJRT_LoadedExecutable_Fingerprint_Args_STRUCT_SIZE;
  fingerprint.executable = exe;
  info = Info(api->PJRT_LoadedExecutable_Fingerprint(&fingerprint));
  EXPECT_EQ(info.code, PJRT_Error_Code_UNIMPLEMENTED);
  EXPECT_NE(info.message.find("PJRT_LoadedExecutable_Fingerprint"), std::string::npos)
      << info.message;
  // Everything else still works.
  PJRT_Buffer* out = nullptr;
  ASSERT_EQ(Execute(exe, {a, a}, &out).code, PJRT_Error_Code_OK);
  buffers_.push_back(out);
  EXPECT_EQ(Download(out, 4), (std::vector<float>{2, 8, 18, 32}));
}

}  // namespace
