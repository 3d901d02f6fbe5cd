// The C-level test fixture: loads the plugin under test with dlopen + GetPjrtApi, as a PJRT
// host such as JAX does, and offers the calls the C-API tests share (client, compile, upload,
// execute, download), each checked. Included by the c_api_*_test.cc files only.
#ifndef FLEXNPU_TESTS_CPP_C_API_TEST_FIXTURE_H_
#define FLEXNPU_TESTS_CPP_C_API_TEST_FIXTURE_H_

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pjrt_c_api.h"
#include "compile_options_proto.h"

namespace {

const PJRT_Api* api = nullptr;
void* plugin_library = nullptr;  // for FlexNPU's exported extras (FlexNpu_StatsJson, ...)

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

struct ErrorInfo {
  PJRT_Error_Code code = PJRT_Error_Code_OK;
  std::string message;
};

// Takes ownership of `error`.
ErrorInfo Info(PJRT_Error* error) {
  ErrorInfo info;
  if (error == nullptr) return info;
  PJRT_Error_Message_Args m{};
  m.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE;
  m.error = error;
  api->PJRT_Error_Message(&m);
  info.message.assign(m.message, m.message_size);
  PJRT_Error_GetCode_Args c{};
  c.struct_size = PJRT_Error_GetCode_Args_STRUCT_SIZE;
  c.error = error;
  EXPECT_EQ(api->PJRT_Error_GetCode(&c), nullptr);
  info.code = c.code;
  PJRT_Error_Destroy_Args d{};
  d.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
  d.error = error;
  api->PJRT_Error_Destroy(&d);
  return info;
}

#define ASSERT_PJRT_OK(expr)                          \
  do {                                                \
    ErrorInfo _info = Info(expr);                     \
    ASSERT_EQ(_info.code, PJRT_Error_Code_OK) << _info.message; \
  } while (0)


constexpr char kAddProgram[] = R"(
module @add attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    %1 = stablehlo.multiply %0, %b : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
})";

// How a caller may shape its Execute call besides the arguments (CApiTest::ExecuteOnDevices).
struct CallShape {
  // The caller's PJRT_ExecuteOptions struct_size: smaller (an older header) or larger (a newer
  // one, its extra bytes set to garbage FlexNPU must not read) than FlexNPU's.
  size_t options_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  // Whether the caller asks for completion events (JAX does; other callers may not).
  bool events = true;
  // Host recv callbacks per device (PJRT_ExecuteOptions::recv_callbacks), none by default.
  PJRT_RecvCallbackInfo** recv_callbacks = nullptr;
  size_t num_recv_ops = 0;
};

class CApiTest : public ::testing::Test {
 public:  // the tests' helper functions call these too
  static void SetUpTestSuite() {
    const std::string path = Env("FLEXNPU_TEST_PLUGIN_PATH");
    ASSERT_FALSE(path.empty()) << "set FLEXNPU_TEST_PLUGIN_PATH";
    void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library, nullptr) << dlerror();
    plugin_library = library;
    auto get_api = reinterpret_cast<const PJRT_Api* (*)()>(dlsym(library, "GetPjrtApi"));
    ASSERT_NE(get_api, nullptr);
    api = get_api();
    PJRT_Plugin_Initialize_Args init{};
    init.struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE;
    ASSERT_PJRT_OK(api->PJRT_Plugin_Initialize(&init));
  }

  void TearDown() override {
    for (PJRT_Buffer* b : buffers_) DestroyBuffer(b);
    for (PJRT_LoadedExecutable* e : executables_) {
      PJRT_LoadedExecutable_Destroy_Args args{};
      args.struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE;
      args.executable = e;
      EXPECT_EQ(Info(api->PJRT_LoadedExecutable_Destroy(&args)).code, PJRT_Error_Code_OK);
    }
    for (PJRT_Client* c : clients_) {
      PJRT_Client_Destroy_Args args{};
      args.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
      args.client = c;
      EXPECT_EQ(Info(api->PJRT_Client_Destroy(&args)).code, PJRT_Error_Code_OK);
    }
  }

  static void DestroyBuffer(PJRT_Buffer* b) {
    PJRT_Buffer_Destroy_Args args{};
    args.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
    args.buffer = b;
    EXPECT_EQ(Info(api->PJRT_Buffer_Destroy(&args)).code, PJRT_Error_Code_OK);
  }

  static PJRT_NamedValue StringOption(const char* name, const std::string& value) {
    PJRT_NamedValue v{};
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = name;
    v.name_size = std::strlen(name);
    v.type = PJRT_NamedValue_kString;
    v.string_value = value.c_str();
    v.value_size = value.size();
    return v;
  }

  static PJRT_NamedValue IntOption(const char* name, int64_t value) {
    PJRT_NamedValue v{};
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = name;
    v.name_size = std::strlen(name);
    v.type = PJRT_NamedValue_kInt64;
    v.int64_value = value;
    v.value_size = 1;
    return v;
  }

  ErrorInfo TryCreateClient(std::vector<PJRT_NamedValue> extra, PJRT_Client** client) {
    cpu_plugin_ = Env("FLEXNPU_CPU_PLUGIN_PATH");
    std::vector<PJRT_NamedValue> options = {StringOption("cpu_plugin_path", cpu_plugin_)};
    options.insert(options.end(), extra.begin(), extra.end());
    PJRT_Client_Create_Args args{};
    args.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE;
    args.create_options = options.data();
    args.num_options = options.size();
    ErrorInfo info = Info(api->PJRT_Client_Create(&args));
    *client = args.client;
    if (info.code == PJRT_Error_Code_OK) clients_.push_back(args.client);
    return info;
  }

  PJRT_Client* CreateClient(int64_t num_virtual) {
    PJRT_Client* client = nullptr;
    ErrorInfo info = TryCreateClient({IntOption("num_virtual_devices", num_virtual)}, &client);
    EXPECT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    return client;
  }

  PJRT_Device* Device(PJRT_Client* client, int id) {
    PJRT_Client_LookupDevice_Args args{};
    args.struct_size = PJRT_Client_LookupDevice_Args_STRUCT_SIZE;
    args.client = client;
    args.id = id;
    EXPECT_EQ(Info(api->PJRT_Client_LookupDevice(&args)).code, PJRT_Error_Code_OK);
    return args.device;
  }

  PJRT_Buffer* Upload(PJRT_Client* client, PJRT_Device* device, const std::vector<float>& data) {
    const int64_t dims[] = {static_cast<int64_t>(data.size())};
    PJRT_Client_BufferFromHostBuffer_Args args{};
    args.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
    args.client = client;
    args.data = data.data();
    args.type = PJRT_Buffer_Type_F32;
    args.dims = dims;
    args.num_dims = 1;
    args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
    args.device = device;
    ErrorInfo info = Info(api->PJRT_Client_BufferFromHostBuffer(&args));
    EXPECT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    if (args.done_with_host_buffer != nullptr) Await(args.done_with_host_buffer);
    buffers_.push_back(args.buffer);
    return args.buffer;
  }

  static void Await(PJRT_Event* event) {
    PJRT_Event_Await_Args args{};
    args.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
    args.event = event;
    EXPECT_EQ(Info(api->PJRT_Event_Await(&args)).code, PJRT_Error_Code_OK);
    PJRT_Event_Destroy_Args destroy{};
    destroy.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
    destroy.event = event;
    EXPECT_EQ(Info(api->PJRT_Event_Destroy(&destroy)).code, PJRT_Error_Code_OK);
  }

  ErrorInfo TryCompile(PJRT_Client* client, const std::string& code, const std::string& options,
                       PJRT_LoadedExecutable** exe) {
    PJRT_Program program{};
    program.struct_size = PJRT_Program_STRUCT_SIZE;
    std::string code_copy = code;
    program.code = code_copy.data();
    program.code_size = code_copy.size();
    program.format = "mlir";
    program.format_size = 4;
    PJRT_Client_Compile_Args args{};
    args.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE;
    args.client = client;
    args.program = &program;
    args.compile_options = options.data();
    args.compile_options_size = options.size();
    ErrorInfo info = Info(api->PJRT_Client_Compile(&args));
    *exe = args.executable;
    if (info.code == PJRT_Error_Code_OK) executables_.push_back(args.executable);
    return info;
  }

  // Executes a single-device program on `inputs`; on success `*output` is the caller's to
  // destroy. Static: test threads call it. await=false destroys the completion event unawaited.
  static ErrorInfo Execute(PJRT_LoadedExecutable* exe, std::vector<PJRT_Buffer*> inputs,
                           PJRT_Buffer** output, bool await = true) {
    std::vector<PJRT_Buffer*> outputs;
    ErrorInfo info = ExecuteOnDevices(exe, {std::move(inputs)}, 1, &outputs, await);
    if (info.code == PJRT_Error_Code_OK) *output = outputs[0];
    return info;
  }

  // Executes a program over inputs.size() devices (an SPMD program: one argument list per
  // device) with `num_outputs` outputs each; on success `outputs` holds them device-major, the
  // caller's to destroy. `execute_device`: where a single-device program runs (null: where it
  // was compiled for).
  static ErrorInfo ExecuteOnDevices(PJRT_LoadedExecutable* exe,
                                    std::vector<std::vector<PJRT_Buffer*>> inputs,
                                    size_t num_outputs, std::vector<PJRT_Buffer*>* outputs,
                                    bool await = true, PJRT_Device* execute_device = nullptr,
                                    CallShape shape = CallShape()) {
    const size_t n = inputs.size();
    constexpr size_t kNewerFields = 128;
    alignas(PJRT_ExecuteOptions) unsigned char
        options_bytes[sizeof(PJRT_ExecuteOptions) + kNewerFields];
    std::memset(options_bytes, 0, sizeof(PJRT_ExecuteOptions));
    std::memset(options_bytes + sizeof(PJRT_ExecuteOptions), 0xAB, kNewerFields);
    PJRT_ExecuteOptions& options = *reinterpret_cast<PJRT_ExecuteOptions*>(options_bytes);
    options.struct_size = std::min(shape.options_size, sizeof(options_bytes));
    options.recv_callbacks = shape.recv_callbacks;
    options.num_recv_ops = shape.num_recv_ops;
    std::vector<PJRT_Buffer* const*> argument_lists(n);
    for (size_t d = 0; d < n; ++d) argument_lists[d] = inputs[d].data();
    outputs->assign(n * num_outputs, nullptr);
    std::vector<PJRT_Buffer**> output_lists(n);
    for (size_t d = 0; d < n; ++d) output_lists[d] = outputs->data() + d * num_outputs;
    std::vector<PJRT_Event*> done(n, nullptr);
    PJRT_LoadedExecutable_Execute_Args args{};
    args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
    args.executable = exe;
    args.options = &options;
    args.argument_lists = argument_lists.data();
    args.num_devices = n;
    args.num_args = n > 0 ? inputs[0].size() : 0;
    args.output_lists = output_lists.data();
    args.device_complete_events = shape.events ? done.data() : nullptr;
    args.execute_device = execute_device;
    ErrorInfo info = Info(api->PJRT_LoadedExecutable_Execute(&args));
    if (info.code != PJRT_Error_Code_OK || !shape.events) return info;
    for (PJRT_Event* event : done) {
      if (await) {
        Await(event);
      } else {
        DestroyEvent(event);
      }
    }
    return info;
  }

  static void DestroyEvent(PJRT_Event* event) {
    PJRT_Event_Destroy_Args destroy{};
    destroy.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
    destroy.event = event;
    EXPECT_EQ(Info(api->PJRT_Event_Destroy(&destroy)).code, PJRT_Error_Code_OK);
  }

  // Execute, the output then owned (destroyed) by the fixture.
  ErrorInfo TryExecute(PJRT_LoadedExecutable* exe, std::vector<PJRT_Buffer*> inputs,
                       PJRT_Buffer** output) {
    ErrorInfo info = Execute(exe, std::move(inputs), output);
    if (info.code == PJRT_Error_Code_OK) buffers_.push_back(*output);
    return info;
  }

  static std::vector<float> Download(PJRT_Buffer* buffer, size_t n) {
    std::vector<float> out(n);
    PJRT_Buffer_ToHostBuffer_Args args{};
    args.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
    args.src = buffer;
    args.dst = out.data();
    args.dst_size = n * sizeof(float);
    ErrorInfo info = Info(api->PJRT_Buffer_ToHostBuffer(&args));
    EXPECT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    if (args.event) Await(args.event);
    return out;
  }

  std::string cpu_plugin_;
  std::vector<PJRT_Client*> clients_;
  std::vector<PJRT_LoadedExecutable*> executables_;
  std::vector<PJRT_Buffer*> buffers_;
};

}  // namespace

#endif  // FLEXNPU_TESTS_CPP_C_API_TEST_FIXTURE_H_
