// The emulated backend (backend/emulated/) through the physical-backend facade, as the runtime
// drives it: options and their errors, buffer metadata, memory accounting and exhaustion,
// compile-once, donation, the modelled duration and the order of executions on the timeline.
// Needs the XLA CPU plugin (its compiler): FLEXNPU_TEST_CPU_PLUGIN (CMake) or
// FLEXNPU_CPU_PLUGIN_PATH.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "compile_options_proto.h"
#include "pjrt_flexnpu/backend/emulated/emulated_backend.h"
#include "pjrt_flexnpu/backend/factory.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "xla_passes/analysis.h"
#include "xla_passes/roofline.h"

namespace flexnpu {
namespace {

std::string CpuPlugin() {
  if (const char* env = std::getenv("FLEXNPU_CPU_PLUGIN_PATH")) return env;
#ifdef FLEXNPU_TEST_CPU_PLUGIN
  return FLEXNPU_TEST_CPU_PLUGIN;
#else
  return "";
#endif
}

constexpr char kMatmul[] = R"(
module @matmul attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a: tensor<512x1024xf32>, %b: tensor<1024x256xf32>) -> tensor<512x256xf32> {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<512x1024xf32>, tensor<1024x256xf32>) -> tensor<512x256xf32>
    return %0 : tensor<512x256xf32>
  }
})";

constexpr char kDonatingAdd[] = R"(
module @donating_add attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a: tensor<1024xf32> {tf.aliasing_output = 0 : i32}, %b: tensor<1024xf32>) -> tensor<1024xf32> {
    %0 = stablehlo.add %a, %b : tensor<1024xf32>
    return %0 : tensor<1024xf32>
  }
})";

// Compute-bound on the preset (a prefill's shape) and bandwidth-bound (a decode's).
constexpr char kComputeBound[] = R"(
module @compute_bound attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a: tensor<4096x4096xbf16>) -> tensor<4096x4096xbf16> {
    %0 = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<4096x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<4096x4096xbf16>
    return %0 : tensor<4096x4096xbf16>
  }
})";
constexpr char kBandwidthBound[] = R"(
module @bandwidth_bound attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a: tensor<8388608xf32>) -> tensor<8388608xf32> {
    %0 = stablehlo.add %a, %a : tensor<8388608xf32>
    return %0 : tensor<8388608xf32>
  }
})";

PJRT_NamedValue Int(const char* name, int64_t v) { return flexnpu::Int64NamedValue(name, v); }
PJRT_NamedValue Float(const char* name, float v) {
  PJRT_NamedValue o = Int(name, 0);
  o.type = PJRT_NamedValue_kFloat;
  o.float_value = v;
  return o;
}
PJRT_NamedValue String(const char* name, const std::string& v) {
  PJRT_NamedValue o = Int(name, 0);
  o.type = PJRT_NamedValue_kString;
  o.string_value = v.c_str();
  o.value_size = v.size();
  return o;
}

class EmulatedBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CpuPlugin().empty()) GTEST_SKIP() << "no XLA CPU plugin: set FLEXNPU_CPU_PLUGIN_PATH";
    auto backend = OpenBackend("emulate:910c");
    ASSERT_TRUE(backend.ok()) << backend.status().message();
    backend_ = *backend;
    plugin_ = CpuPlugin();
  }

  StatusOr<InnerClient> Create(std::vector<PJRT_NamedValue> options) {
    options.push_back(String("cpu_plugin_path", plugin_));
    return backend_->CreateClient(options.data(), options.size());
  }

  PJRT_Device* Device(PJRT_Client* client, int i) {
    auto devices = backend_->AddressableDevices(client);
    EXPECT_TRUE(devices.ok());
    return (*devices)[i];
  }

  // A buffer of `type` and `dims` on device `d`; `data` is never read.
  StatusOr<InnerBuffer> Upload(PJRT_Client* client, int d, PJRT_Buffer_Type type,
                               std::vector<int64_t> dims) {
    static const char kData[16] = {};
    PJRT_Client_BufferFromHostBuffer_Args args{};
    args.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
    args.data = kData;
    args.type = type;
    args.dims = dims.data();
    args.num_dims = dims.size();
    args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
    auto memory = backend_->DefaultMemory(Device(client, d));
    if (!memory.ok()) return memory.status();
    auto transfer = backend_->BufferFromHostBuffer(client, args, *memory);
    if (!transfer.ok()) return transfer.status();
    if (transfer->done_with_host_buffer) {
      auto ready = backend_->IsReady(transfer->done_with_host_buffer.get());
      EXPECT_TRUE(ready.ok() && *ready) << "the host data is never read: done at once";
    }
    return std::move(transfer->buffer);
  }

  StatusOr<InnerLoadedExecutable> Compile(PJRT_Client* client, const std::string& code,
                                          int64_t device) {
    PJRT_Program program{};
    program.struct_size = PJRT_Program_STRUCT_SIZE;
    std::string text = code;
    program.code = text.data();
    program.code_size = text.size();
    program.format = "mlir";
    program.format_size = 4;
    return backend_->Compile(client, &program, CompileOptionsFor(device));
  }

  // Executes a single-device executable; the outputs and completion event are the caller's.
  Status Execute(PJRT_LoadedExecutable* exe, std::vector<PJRT_Buffer*> args, size_t num_outputs,
                 std::vector<InnerBuffer>* outputs, InnerEvent* done) {
    PJRT_ExecuteOptions options{};
    options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
    PJRT_Buffer* const* lists[] = {args.data()};
    std::vector<PJRT_Buffer*> out(num_outputs, nullptr);
    PJRT_Buffer** out_lists[] = {out.data()};
    PJRT_Event* event = nullptr;
    InnerLaunch launch;
    launch.executable = exe;
    launch.options = &options;
    launch.argument_lists = lists;
    launch.num_devices = 1;
    launch.num_args = args.size();
    launch.output_lists = out_lists;
    launch.device_complete_events = &event;
    Status status = backend_->Execute(launch);
    if (!status.ok()) return status;
    for (PJRT_Buffer* b : out) outputs->push_back(Own(*backend_, b));
    *done = Own(*backend_, event);
    return Status::Ok();
  }

  std::shared_ptr<const PhysicalBackend> backend_;
  std::string plugin_;
};

TEST_F(EmulatedBackendTest, DefaultsToEightDevicesOfThePresetsMemory) {
  auto client = Create({});
  ASSERT_TRUE(client.ok()) << client.status().message();
  auto devices = backend_->AddressableDevices(client->get());
  ASSERT_TRUE(devices.ok());
  EXPECT_EQ(devices->size, 8u);
  auto kind = backend_->DescriptionKind(*backend_->Description((*devices)[3]));
  EXPECT_EQ(*kind, "ascend910c (emulated)");
  auto limit = backend_->BytesLimit((*devices)[3]);
  EXPECT_EQ(*limit, static_cast<int64_t>(xla_passes::FindDevice("910c")->memory_bytes));
}

TEST_F(EmulatedBackendTest, RejectsUnknownPresetsAndOptionsByName) {
  auto unknown = OpenBackend("emulate:tpu9");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), Code::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("unknown preset 'tpu9'"), std::string::npos);
  for (const char* known : {"ascend910b", "ascend910c", "h100", "h200", "a100"}) {
    EXPECT_NE(unknown.status().message().find(known), std::string::npos) << known;
  }
  struct Case {
    std::vector<PJRT_NamedValue> options;
    const char* named;
  };
  const std::vector<Case> cases = {
      {{Int("device_count", 0)}, "'device_count'"},
      {{String("device_count", "eight")}, "'device_count'"},
      {{Float("time_scale", 0)}, "'time_scale'"},
      {{Int("time_scale", -2)}, "'time_scale'"},
      {{Int("devices", 2), Int("speed", 1)}, "'devices', 'speed'"},
  };
  for (const Case& c : cases) {
    auto client = Create(c.options);
    ASSERT_FALSE(client.ok()) << c.named;
    EXPECT_EQ(client.status().code(), Code::kInvalidArgument);
    EXPECT_NE(client.status().message().find(c.named), std::string::npos)
        << client.status().message();
  }
}

TEST_F(EmulatedBackendTest, BuffersAreMetadataThatReadBackAsZeros) {
  auto client = Create({Int("device_count", 2)});
  ASSERT_TRUE(client.ok()) << client.status().message();
  auto buffer = Upload(client->get(), 1, PJRT_Buffer_Type_BF16, {3, 5});
  ASSERT_TRUE(buffer.ok()) << buffer.status().message();
  auto metadata = backend_->Metadata(buffer->get());
  ASSERT_TRUE(metadata.ok());
  EXPECT_EQ(metadata->element_type, PJRT_Buffer_Type_BF16);
  EXPECT_EQ(metadata->dims, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(metadata->on_device_size, 30);
  EXPECT_EQ(*backend_->Memory(buffer->get()), *backend_->DefaultMemory(Device(client->get(), 1)));

  std::vector<unsigned char> host(30, 0xAB);
  PJRT_Buffer_ToHostBuffer_Args args{};
  args.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
  args.src = buffer->get();
  args.dst = host.data();
  args.dst_size = host.size();
  ASSERT_TRUE(FLEXNPU_INNER_CALL(*backend_, PJRT_Buffer_ToHostBuffer, &args).ok());
  InnerEvent done = Own(*backend_, args.event);
  ASSERT_TRUE(backend_->Await(done.get()).ok());
  EXPECT_EQ(host, std::vector<unsigned char>(30, 0));

  auto pointer = backend_->UnsafePointer(buffer->get());
  ASSERT_FALSE(pointer.ok());
  EXPECT_EQ(pointer.status().code(), Code::kUnimplemented);
}

TEST_F(EmulatedBackendTest, AllocationBeyondThePresetsMemoryIsResourceExhausted) {
  auto client = Create({Int("device_count", 2)});
  ASSERT_TRUE(client.ok()) << client.status().message();
  // 100 GB fit in a 128 GB device (no host memory is used: nothing is stored) ...
  auto held = Upload(client->get(), 1, PJRT_Buffer_Type_F32, {25'000'000'000});
  ASSERT_TRUE(held.ok()) << held.status().message();
  // ... another 40 GB do not.
  auto refused = Upload(client->get(), 1, PJRT_Buffer_Type_F32, {10'000'000'000});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kResourceExhausted);
  const std::string& message = refused.status().message();
  EXPECT_NE(message.find("device 1"), std::string::npos) << message;
  EXPECT_NE(message.find("needs 40.00 GB (40000000000 bytes)"), std::string::npos) << message;
  EXPECT_NE(message.find("28.00 GB (28000000000 bytes) of 128.00 GB"), std::string::npos)
      << message;
  // Another device has its own memory; freeing gives it back.
  EXPECT_TRUE(Upload(client->get(), 0, PJRT_Buffer_Type_F32, {10'000'000'000}).ok());
  ASSERT_TRUE(backend_->Delete(held->get()).ok());
  EXPECT_TRUE(Upload(client->get(), 1, PJRT_Buffer_Type_F32, {10'000'000'000}).ok());
}

TEST_F(EmulatedBackendTest, CompilesEachProgramOnceForAllDevices) {
  auto client = Create({Int("device_count", 4)});
  ASSERT_TRUE(client.ok()) << client.status().message();
  std::vector<InnerLoadedExecutable> executables;
  for (int64_t device = 0; device < 4; ++device) {
    auto exe = Compile(client->get(), kMatmul, device);
    ASSERT_TRUE(exe.ok()) << exe.status().message();
    auto devices = backend_->AddressableDevices(exe->get());
    ASSERT_EQ(devices->size, 1u);
    EXPECT_EQ(devices->data[0], Device(client->get(), static_cast<int>(device)));
    executables.push_back(std::move(*exe));
  }
  EXPECT_EQ(emulated::CpuCompiles(client->get()), 1);
  auto other = Compile(client->get(), kDonatingAdd, 2);
  ASSERT_TRUE(other.ok()) << other.status().message();
  EXPECT_EQ(emulated::CpuCompiles(client->get()), 2);
}

TEST_F(EmulatedBackendTest, ModelledTimeIsTheCostModelsPrediction) {
  const xla_passes::DeviceSpec preset = *xla_passes::FindDevice("910c");
  double first_busy = -1;
  for (int round = 0; round < 2; ++round) {  // two clients: the same program, the same time
    auto client = Create({Int("device_count", 2)});
    ASSERT_TRUE(client.ok()) << client.status().message();
    auto exe = Compile(client->get(), kMatmul, 0);
    ASSERT_TRUE(exe.ok()) << exe.status().message();
    auto a = Upload(client->get(), 0, PJRT_Buffer_Type_F32, {512, 1024});
    auto b = Upload(client->get(), 0, PJRT_Buffer_Type_F32, {1024, 256});
    std::vector<InnerBuffer> outputs;
    InnerEvent done;
    ASSERT_TRUE(Execute(exe->get(), {a->get(), b->get()}, 1, &outputs, &done).ok());
    auto metadata = backend_->Metadata(outputs[0].get());
    EXPECT_EQ(metadata->element_type, PJRT_Buffer_Type_F32);
    EXPECT_EQ(metadata->dims, (std::vector<int64_t>{512, 256}));

    auto inner = backend_->GetExecutable(exe->get());
    auto profile = xla_passes::AnalyzeHloProto(*backend_->OptimizedProgram(inner->get()));
    ASSERT_TRUE(profile.ok());
    auto cost = xla_passes::Classify(*profile, preset);
    EXPECT_EQ(cost->flops, 2.0 * 512 * 1024 * 256);
    auto modelled = backend_->ModelledTime(Device(client->get(), 0));
    ASSERT_TRUE(modelled.ok()) << modelled.status().message();
    EXPECT_EQ(modelled->executions, 1);
    EXPECT_DOUBLE_EQ(modelled->busy_s, xla_passes::ModelledSeconds(preset, cost->flops,
                                                                   cost->bytes));
    EXPECT_EQ(backend_->ModelledTime(Device(client->get(), 1))->executions, 0);
    if (round == 0) first_busy = modelled->busy_s;
    if (round == 1) EXPECT_EQ(modelled->busy_s, first_busy);
  }
}

TEST_F(EmulatedBackendTest, OneDeviceRunsInOrderDevicesRunSideBySide) {
  // Long durations (x1e5: ~2 s each) make the launches' own spacing negligible.
  auto client = Create({Int("device_count", 2), Float("time_scale", 1e5)});
  ASSERT_TRUE(client.ok()) << client.status().message();
  auto on0 = Compile(client->get(), kMatmul, 0);
  auto on1 = Compile(client->get(), kMatmul, 1);
  ASSERT_TRUE(on0.ok() && on1.ok());
  auto a0 = Upload(client->get(), 0, PJRT_Buffer_Type_F32, {512, 1024});
  auto b0 = Upload(client->get(), 0, PJRT_Buffer_Type_F32, {1024, 256});
  auto a1 = Upload(client->get(), 1, PJRT_Buffer_Type_F32, {512, 1024});
  auto b1 = Upload(client->get(), 1, PJRT_Buffer_Type_F32, {1024, 256});
  std::vector<InnerBuffer> outputs;
  InnerEvent first, second, beside;
  ASSERT_TRUE(Execute(on0->get(), {a0->get(), b0->get()}, 1, &outputs, &first).ok());
  ASSERT_TRUE(Execute(on0->get(), {a0->get(), b0->get()}, 1, &outputs, &second).ok());
  ASSERT_TRUE(Execute(on1->get(), {a1->get(), b1->get()}, 1, &outputs, &beside).ok());
  const double seconds = backend_->ModelledTime(Device(client->get(), 0))->busy_s / 2;
  const int64_t duration = static_cast<int64_t>(std::llround(seconds * 1e5 * 1e9));
  const int64_t t1 = emulated::EventReadyNs(first.get());
  const int64_t t2 = emulated::EventReadyNs(second.get());
  const int64_t t3 = emulated::EventReadyNs(beside.get());
  // The second execution on device 0 starts when the first finishes ...
  EXPECT_EQ(t2 - t1, duration);
  // ... the one on device 1 does not wait for device 0: it overlaps the first.
  EXPECT_LT(t3 - t1, duration / 2);
  EXPECT_GT(t3 - t1, -duration / 2);
  // Its outputs are ready when it finishes.
  auto output_ready = backend_->ReadyEvent(outputs[1].get());
  ASSERT_TRUE(output_ready.ok());
  EXPECT_EQ(emulated::EventReadyNs(output_ready->get()), t2);
}

TEST_F(EmulatedBackendTest, CoRunOverlapsCoLocatedExecutionsAsThePlacersModelSays) {
  // A decode-shaped execution launched right behind a prefill-shaped one on the same device:
  // in order it waits for it; co-run (the placer's model) it shares the device and ends first.
  for (const bool co_run : {false, true}) {
    PJRT_NamedValue co = Int("co_run", co_run ? 1 : 0);
    auto client = Create({Int("device_count", 1), Float("time_scale", 1e3), co});
    ASSERT_TRUE(client.ok()) << client.status().message();
    auto prefill = Compile(client->get(), kComputeBound, 0);
    auto decode = Compile(client->get(), kBandwidthBound, 0);
    ASSERT_TRUE(prefill.ok() && decode.ok());
    auto x = Upload(client->get(), 0, PJRT_Buffer_Type_BF16, {4096, 4096});
    auto y = Upload(client->get(), 0, PJRT_Buffer_Type_F32, {8388608});
    auto modelled = backend_->ModelledTime(Device(client->get(), 0));
    EXPECT_EQ(modelled->co_run, co_run);
    std::vector<InnerBuffer> outputs;
    InnerEvent p, d;
    ASSERT_TRUE(Execute(prefill->get(), {x->get()}, 1, &outputs, &p).ok());
    ASSERT_TRUE(Execute(decode->get(), {y->get()}, 1, &outputs, &d).ok());
    const int64_t prefill_done = emulated::EventReadyNs(p.get());
    const int64_t decode_done = emulated::EventReadyNs(d.get());
    if (co_run) {
      EXPECT_LT(decode_done, prefill_done);
    } else {
      EXPECT_GT(decode_done, prefill_done);
    }
  }
}

TEST_F(EmulatedBackendTest, DonatedInputsAreConsumedAndTheirMemoryReused) {
  auto client = Create({Int("device_count", 1)});
  ASSERT_TRUE(client.ok()) << client.status().message();
  auto exe = Compile(client->get(), kDonatingAdd, 0);
  ASSERT_TRUE(exe.ok()) << exe.status().message();
  auto a = Upload(client->get(), 0, PJRT_Buffer_Type_F32, {1024});
  auto b = Upload(client->get(), 0, PJRT_Buffer_Type_F32, {1024});
  PJRT_Device_MemoryStats_Args stats{};
  stats.struct_size = PJRT_Device_MemoryStats_Args_STRUCT_SIZE;
  stats.device = Device(client->get(), 0);
  ASSERT_TRUE(FLEXNPU_INNER_CALL(*backend_, PJRT_Device_MemoryStats, &stats).ok());
  EXPECT_EQ(stats.bytes_in_use, 8192);
  std::vector<InnerBuffer> outputs;
  InnerEvent done;
  ASSERT_TRUE(Execute(exe->get(), {a->get(), b->get()}, 1, &outputs, &done).ok());
  EXPECT_TRUE(*backend_->IsDeleted(a->get()));
  EXPECT_FALSE(*backend_->IsDeleted(b->get()));
  ASSERT_TRUE(FLEXNPU_INNER_CALL(*backend_, PJRT_Device_MemoryStats, &stats).ok());
  EXPECT_EQ(stats.bytes_in_use, 8192);  // the output took the donated input's place
  // A consumed buffer cannot be an argument again.
  std::vector<InnerBuffer> again;
  Status reused = Execute(exe->get(), {a->get(), b->get()}, 1, &again, &done);
  EXPECT_EQ(reused.code(), Code::kInvalidArgument);
  EXPECT_NE(reused.message().find("argument 0"), std::string::npos) << reused.message();
}

}  // namespace
}  // namespace flexnpu
