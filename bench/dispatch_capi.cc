// Dispatch cost at the C level: a tiny single-device program (add + multiply of two f32[4])
// executed `--calls` times through a PJRT plugin's C API the way jaxlib drives it per jitted
// call: Execute with a completion event, OnReady on that event (the callback destroys it),
// ReadyEvent on the output, Await it, destroy event and output.
//
// Run the same loop over FlexNPU and over the physical plugin directly; under callgrind the
// loop alone is measured (CALLGRIND_ZERO_STATS / CALLGRIND_DUMP_STATS_AT around it, all
// threads), so instructions per call are independent of machine load. bench/dispatch_capi.py
// runs both under callgrind and prints FlexNPU's extra instructions per call.
//
//   dispatch_capi --plugin PATH [--option NAME=VALUE]... [--calls N] [--warmup N]
//   (VALUE is an int64 when it parses as one, else a string; e.g. for FlexNPU:
//    --option cpu_plugin_path=.../xla_cpu_pjrt.so --option policy=dynamic
//    --option num_virtual_devices=8)
//
// Built with the C++ tests (FLEXNPU_BUILD_TESTS=ON): build/<dir>/dispatch_capi.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pjrt_c_api.h"
#include "../tests/cpp/compile_options_proto.h"

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define FLEXNPU_HAVE_CALLGRIND 1
#endif
#endif
#ifndef FLEXNPU_HAVE_CALLGRIND
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(pos)
#endif

namespace {

const PJRT_Api* api = nullptr;

// Exits with the error's message when `error` is set (a benchmark has no recovery path).
void Check(PJRT_Error* error, const char* where) {
  if (error == nullptr) return;
  PJRT_Error_Message_Args m{};
  m.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE;
  m.error = error;
  api->PJRT_Error_Message(&m);
  std::fprintf(stderr, "%s: %.*s\n", where, static_cast<int>(m.message_size), m.message);
  std::exit(1);
}

void DestroyEvent(PJRT_Event* event) {
  PJRT_Event_Destroy_Args d{};
  d.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
  d.event = event;
  Check(api->PJRT_Event_Destroy(&d), "PJRT_Event_Destroy");
}

void DestroyBuffer(PJRT_Buffer* buffer) {
  PJRT_Buffer_Destroy_Args d{};
  d.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
  d.buffer = buffer;
  Check(api->PJRT_Buffer_Destroy(&d), "PJRT_Buffer_Destroy");
}

void AwaitAndDestroy(PJRT_Event* event) {
  PJRT_Event_Await_Args a{};
  a.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
  a.event = event;
  Check(api->PJRT_Event_Await(&a), "PJRT_Event_Await");
  DestroyEvent(event);
}


constexpr char kProgram[] = R"(
module @tiny attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    %1 = stablehlo.multiply %0, %b : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
})";

struct Loop {
  PJRT_LoadedExecutable* executable = nullptr;
  PJRT_Buffer* inputs[2] = {nullptr, nullptr};
};

// One call as jaxlib makes it for a jitted function followed by block_until_ready.
void OneCall(const Loop& loop) {
  PJRT_ExecuteOptions options{};
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  PJRT_Buffer* const* argument_lists[1] = {loop.inputs};
  PJRT_Buffer* output = nullptr;
  PJRT_Buffer** output_lists[1] = {&output};
  PJRT_Event* complete = nullptr;
  PJRT_LoadedExecutable_Execute_Args args{};
  args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  args.executable = loop.executable;
  args.options = &options;
  args.argument_lists = argument_lists;
  args.num_devices = 1;
  args.num_args = 2;
  args.output_lists = output_lists;
  args.device_complete_events = &complete;
  Check(api->PJRT_LoadedExecutable_Execute(&args), "PJRT_LoadedExecutable_Execute");
  if (complete != nullptr) {
    PJRT_Event_OnReady_Args on_ready{};
    on_ready.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE;
    on_ready.event = complete;
    on_ready.callback = [](PJRT_Error* error, void* user_arg) {
      Check(error, "execution");
      DestroyEvent(static_cast<PJRT_Event*>(user_arg));  // JAX's pattern: the callback frees it
    };
    on_ready.user_arg = complete;
    Check(api->PJRT_Event_OnReady(&on_ready), "PJRT_Event_OnReady");
  }
  PJRT_Buffer_ReadyEvent_Args ready{};
  ready.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
  ready.buffer = output;
  Check(api->PJRT_Buffer_ReadyEvent(&ready), "PJRT_Buffer_ReadyEvent");
  AwaitAndDestroy(ready.event);
  DestroyBuffer(output);
}

PJRT_NamedValue Option(const std::string& spec, std::vector<std::string>* storage) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos) {
    std::fprintf(stderr, "--option %s: expected NAME=VALUE\n", spec.c_str());
    std::exit(2);
  }
  storage->push_back(spec.substr(0, eq));
  const std::string& name = storage->back();
  const std::string value = spec.substr(eq + 1);
  PJRT_NamedValue v{};
  v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
  v.name = name.c_str();
  v.name_size = name.size();
  char* end = nullptr;
  const long long number = std::strtoll(value.c_str(), &end, 10);
  if (!value.empty() && end != nullptr && *end == '\0') {
    v.type = PJRT_NamedValue_kInt64;
    v.int64_value = number;
    v.value_size = 1;
  } else {
    storage->push_back(value);
    v.type = PJRT_NamedValue_kString;
    v.string_value = storage->back().c_str();
    v.value_size = storage->back().size();
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string plugin;
  std::vector<std::string> option_specs;
  long calls = 2000;
  long warmup = 200;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", arg.c_str());
      return 2;
    }
    if (arg == "--plugin") {
      plugin = argv[++i];
    } else if (arg == "--option") {
      option_specs.push_back(argv[++i]);
    } else if (arg == "--calls") {
      calls = std::atol(argv[++i]);
    } else if (arg == "--warmup") {
      warmup = std::atol(argv[++i]);
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (plugin.empty() || calls <= 0 || warmup < 0) {
    std::fprintf(stderr, "usage: %s --plugin PATH [--option NAME=VALUE]... [--calls N>0] "
                         "[--warmup N>=0]\n", argv[0]);
    return 2;
  }
  void* library = dlopen(plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "dlopen %s: %s\n", plugin.c_str(), dlerror());
    return 1;
  }
  auto get_api = reinterpret_cast<const PJRT_Api* (*)()>(dlsym(library, "GetPjrtApi"));
  if (get_api == nullptr || (api = get_api()) == nullptr) {
    std::fprintf(stderr, "%s is not a PJRT plugin\n", plugin.c_str());
    return 1;
  }
  PJRT_Plugin_Initialize_Args init{};
  init.struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE;
  Check(api->PJRT_Plugin_Initialize(&init), "PJRT_Plugin_Initialize");

  std::vector<std::string> storage;
  storage.reserve(2 * option_specs.size());  // options point into it
  std::vector<PJRT_NamedValue> options;
  for (const std::string& spec : option_specs) options.push_back(Option(spec, &storage));
  PJRT_Client_Create_Args create{};
  create.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE;
  create.create_options = options.data();
  create.num_options = options.size();
  Check(api->PJRT_Client_Create(&create), "PJRT_Client_Create");
  PJRT_Client* client = create.client;

  PJRT_Client_AddressableDevices_Args devices{};
  devices.struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE;
  devices.client = client;
  Check(api->PJRT_Client_AddressableDevices(&devices), "PJRT_Client_AddressableDevices");
  PJRT_Device* device = devices.addressable_devices[0];
  PJRT_Device_GetDescription_Args description{};
  description.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE;
  description.device = device;
  Check(api->PJRT_Device_GetDescription(&description), "PJRT_Device_GetDescription");
  PJRT_DeviceDescription_Id_Args id{};
  id.struct_size = PJRT_DeviceDescription_Id_Args_STRUCT_SIZE;
  id.device_description = description.device_description;
  Check(api->PJRT_DeviceDescription_Id(&id), "PJRT_DeviceDescription_Id");

  Loop loop;
  std::string code = kProgram;
  PJRT_Program program{};
  program.struct_size = PJRT_Program_STRUCT_SIZE;
  program.code = code.data();
  program.code_size = code.size();
  program.format = "mlir";
  program.format_size = 4;
  const std::string compile_options = CompileOptionsFor(id.id);
  PJRT_Client_Compile_Args compile{};
  compile.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE;
  compile.client = client;
  compile.program = &program;
  compile.compile_options = compile_options.data();
  compile.compile_options_size = compile_options.size();
  Check(api->PJRT_Client_Compile(&compile), "PJRT_Client_Compile");
  loop.executable = compile.executable;

  const float data[4] = {1, 2, 3, 4};
  const int64_t dims[1] = {4};
  for (PJRT_Buffer*& input : loop.inputs) {
    PJRT_Client_BufferFromHostBuffer_Args upload{};
    upload.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
    upload.client = client;
    upload.data = data;
    upload.type = PJRT_Buffer_Type_F32;
    upload.dims = dims;
    upload.num_dims = 1;
    upload.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
    upload.device = device;
    Check(api->PJRT_Client_BufferFromHostBuffer(&upload), "PJRT_Client_BufferFromHostBuffer");
    if (upload.done_with_host_buffer != nullptr) AwaitAndDestroy(upload.done_with_host_buffer);
    input = upload.buffer;
  }

  for (long i = 0; i < warmup; ++i) OneCall(loop);
  // Wall time per block of 100 calls (secondary: load-dependent), instructions (callgrind).
  std::vector<double> block_ns;
  CALLGRIND_START_INSTRUMENTATION;  // a no-op unless run with --instr-atstart=no
  CALLGRIND_ZERO_STATS;
  for (long done = 0; done < calls;) {
    const long block = std::min(100L, calls - done);
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < block; ++i) OneCall(loop);
    const auto end = std::chrono::steady_clock::now();
    block_ns.push_back(std::chrono::duration<double, std::nano>(end - start).count() / block);
    done += block;
  }
  CALLGRIND_DUMP_STATS_AT("dispatch loop");
  std::sort(block_ns.begin(), block_ns.end());
  std::printf("calls %ld  ns/call: min %.0f  median %.0f  (blocks of 100)\n", calls, block_ns[0],
              block_ns[block_ns.size() / 2]);

  for (PJRT_Buffer* input : loop.inputs) DestroyBuffer(input);
  PJRT_LoadedExecutable_Destroy_Args destroy_exe{};
  destroy_exe.struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE;
  destroy_exe.executable = loop.executable;
  Check(api->PJRT_LoadedExecutable_Destroy(&destroy_exe), "PJRT_LoadedExecutable_Destroy");
  PJRT_Client_Destroy_Args destroy_client{};
  destroy_client.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
  destroy_client.client = client;
  Check(api->PJRT_Client_Destroy(&destroy_client), "PJRT_Client_Destroy");
  return 0;
}
