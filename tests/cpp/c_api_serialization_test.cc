// PJRT_Executable_Serialize / PJRT_Executable_DeserializeAndLoad through the C API: round trips
// equal direct results (same client, another client with another policy and device count),
// envelopes from another physical platform, format or inner build, and corrupt, truncated or
// extended bytes (every one an INVALID_ARGUMENT naming the call and the damage, never a crash,
// never a load). The corruption tests flip and cut at fixed positions: the inner plugin's
// bytes differ from compile to compile, the positions and the verdicts do not.
#include <dlfcn.h>

#include <cstdio>

#include "c_api_test_fixture.h"

namespace {

class SerializationTest : public CApiTest {
 public:
  // Runs a single-device program with one output of 4 floats and reads it back.
  std::vector<float> Run(PJRT_LoadedExecutable* exe, const std::vector<PJRT_Buffer*>& inputs) {
    PJRT_ExecuteOptions options{};
    options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
    PJRT_Buffer* const* argument_list = inputs.data();
    PJRT_Buffer* output = nullptr;
    PJRT_Buffer** output_list = &output;
    PJRT_Event* done = nullptr;
    PJRT_LoadedExecutable_Execute_Args args{};
    args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
    args.executable = exe;
    args.options = &options;
    args.argument_lists = &argument_list;
    args.num_devices = 1;
    args.num_args = inputs.size();
    args.output_lists = &output_list;
    args.device_complete_events = &done;
    ErrorInfo info = Info(api->PJRT_LoadedExecutable_Execute(&args));
    EXPECT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    if (info.code != PJRT_Error_Code_OK) return {};
    Await(done);
    buffers_.push_back(output);
    return Download(output, 4);
  }

  std::string Serialize(PJRT_LoadedExecutable* loaded) {
    PJRT_LoadedExecutable_GetExecutable_Args get{};
    get.struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE;
    get.loaded_executable = loaded;
    EXPECT_EQ(Info(api->PJRT_LoadedExecutable_GetExecutable(&get)).code, PJRT_Error_Code_OK);
    PJRT_Executable_Serialize_Args args{};
    args.struct_size = PJRT_Executable_Serialize_Args_STRUCT_SIZE;
    args.executable = get.executable;
    ErrorInfo info = Info(api->PJRT_Executable_Serialize(&args));
    EXPECT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    std::string bytes(args.serialized_bytes, args.serialized_bytes_size);
    args.serialized_executable_deleter(args.serialized_executable);
    PJRT_Executable_Destroy_Args destroy{};
    destroy.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE;
    destroy.executable = get.executable;
    EXPECT_EQ(Info(api->PJRT_Executable_Destroy(&destroy)).code, PJRT_Error_Code_OK);
    return bytes;
  }

  ErrorInfo TryLoad(PJRT_Client* client, const std::string& bytes, PJRT_LoadedExecutable** out,
                    const std::string& overridden_options = "") {
    PJRT_Executable_DeserializeAndLoad_Args args{};
    args.struct_size = PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE;
    args.client = client;
    args.serialized_executable = bytes.data();
    args.serialized_executable_size = bytes.size();
    if (!overridden_options.empty()) {
      args.overridden_serialized_compile_options = overridden_options.data();
      args.overridden_serialized_compile_options_size = overridden_options.size();
    }
    ErrorInfo info = Info(api->PJRT_Executable_DeserializeAndLoad(&args));
    *out = args.loaded_executable;
    if (info.code == PJRT_Error_Code_OK) executables_.push_back(args.loaded_executable);
    return info;
  }

  // Sum of a counter of FlexNpu_StatsJson over all live clients (e.g. "backend_loads").
  static int64_t Counter(const std::string& key) {
    auto stats = reinterpret_cast<const char* (*)()>(dlsym(plugin_library, "FlexNpu_StatsJson"));
    EXPECT_NE(stats, nullptr);
    const std::string json = stats();
    const std::string needle = "\"" + key + "\":";
    int64_t sum = 0;
    for (size_t at = json.find(needle); at != std::string::npos; at = json.find(needle, at + 1)) {
      sum += std::atoll(json.c_str() + at + needle.size());
    }
    return sum;
  }

  PJRT_LoadedExecutable* CompileAdd(PJRT_Client* client, int device) {
    PJRT_LoadedExecutable* exe = nullptr;
    ErrorInfo info = TryCompile(client, kAddProgram, CompileOptionsFor(device), &exe);
    EXPECT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    return exe;
  }

  PJRT_Device* OnlyDevice(PJRT_LoadedExecutable* exe) {
    PJRT_LoadedExecutable_AddressableDevices_Args args{};
    args.struct_size = PJRT_LoadedExecutable_AddressableDevices_Args_STRUCT_SIZE;
    args.executable = exe;
    EXPECT_EQ(Info(api->PJRT_LoadedExecutable_AddressableDevices(&args)).code,
              PJRT_Error_Code_OK);
    EXPECT_EQ(args.num_addressable_devices, 1u);
    return args.num_addressable_devices == 1 ? args.addressable_devices[0] : nullptr;
  }

  const std::vector<float> a_ = {1, 2, 3, 4};
  const std::vector<float> b_ = {10, 20, 30, 40};
  const std::vector<float> expected_ = {110, 440, 990, 1760};  // (a + b) * b
};

// The envelope layout of runtime/executable_serialization.h, written by hand: a test that
// the format is what the header documents, and a way to make entries no FlexNPU would write.
// The header: magic (18 bytes), format (u32 LE), payload size (u64 LE), CRC-32C of all other
// bytes (u32 LE); then the payload.
constexpr size_t kMagicSize = 18;
constexpr size_t kChecksumAt = kMagicSize + 4 + 8;
constexpr size_t kHeaderSize = kChecksumAt + 4;

// CRC-32C bit by bit: the definition, independent of the plugin's table-driven code.
uint32_t Crc32c(const std::string& data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) != 0 ? 0x82F63B78u : 0u);
  }
  return ~crc;
}

void AppendLittleEndian(std::string* out, uint64_t value, int width) {
  for (int i = 0; i < width; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t ReadLittleEndian(const std::string& data, size_t at, int width) {
  uint64_t value = 0;
  for (int i = 0; i < width; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(data[at + i])) << (8 * i);
  }
  return value;
}

// `payload` under a header of format `format` with its right checksum.
std::string Seal(uint32_t format, const std::string& payload) {
  std::string out = "flexnpu-executable";
  AppendLittleEndian(&out, format, 4);
  AppendLittleEndian(&out, payload.size(), 8);
  const uint32_t checksum = Crc32c(out + payload);
  AppendLittleEndian(&out, checksum, 4);
  return out + payload;
}

std::string Payload(const std::string& platform_version, const std::string& backend_platform,
                    int device, const std::string& program = kAddProgram) {
  std::string body;
  AppendBytes(&body, 1, platform_version);
  AppendBytes(&body, 2, backend_platform);
  AppendBytes(&body, 3, "mlir");
  AppendBytes(&body, 4, program);
  AppendBytes(&body, 5, CompileOptionsFor(device));
  return body;
}

std::string Envelope(uint32_t format, const std::string& platform_version,
                     const std::string& backend_platform, int device) {
  return Seal(format, Payload(platform_version, backend_platform, device));
}

// Format 1: a protobuf envelope (magic, format, body, a 64-bit FNV-1a of the body as a varint).
std::string Format1Envelope(const std::string& body) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : body) hash = (hash ^ c) * 0x100000001b3ULL;
  std::string out;
  AppendBytes(&out, 1, "flexnpu-executable");
  AppendVarint(&out, (2 << 3) | 0);
  AppendVarint(&out, 1);
  AppendBytes(&out, 3, body);
  AppendVarint(&out, (4 << 3) | 0);
  AppendVarint(&out, hash);
  return out;
}

// `bytes` with bit `bit` of byte `at` flipped.
std::string Flipped(std::string bytes, size_t at, int bit) {
  bytes[at] = static_cast<char>(bytes[at] ^ (1 << bit));
  return bytes;
}

// What the envelope check reports for a flipped bit at `at`: a magic byte is named as such,
// any other (header or payload) fails the checksum.
std::string DamageFor(size_t at) {
  return at < kMagicSize ? "magic 'flexnpu-executable' damaged at byte " + std::to_string(at)
                         : std::string("checksum mismatch (stored 0x");
}

// JAX hashes the serialized topology into its persistent-cache key: equal over the same
// backend whatever the virtual device count (serialized executables load under any), different
// when the platform name JAX sees differs; Deserialize is refused by name.
TEST_F(SerializationTest, TopologySerializesToBytesEqualForEqualTopologies) {
  auto serialize = [&](PJRT_Client* client) {
    PJRT_Client_TopologyDescription_Args get{};
    get.struct_size = PJRT_Client_TopologyDescription_Args_STRUCT_SIZE;
    get.client = client;
    EXPECT_EQ(Info(api->PJRT_Client_TopologyDescription(&get)).code, PJRT_Error_Code_OK);
    PJRT_TopologyDescription_Serialize_Args args{};
    args.struct_size = PJRT_TopologyDescription_Serialize_Args_STRUCT_SIZE;
    args.topology = get.topology;
    ErrorInfo info = Info(api->PJRT_TopologyDescription_Serialize(&args));
    EXPECT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    if (info.code != PJRT_Error_Code_OK) return std::string();
    EXPECT_NE(args.serialized_topology_deleter, nullptr);
    std::string bytes(args.serialized_bytes, args.serialized_bytes_size);
    args.serialized_topology_deleter(args.serialized_topology);
    return bytes;
  };
  const std::string four = serialize(CreateClient(4));
  EXPECT_FALSE(four.empty());
  EXPECT_EQ(serialize(CreateClient(4)), four);
  EXPECT_EQ(serialize(CreateClient(6)), four);
  PJRT_Client* as_cpu = nullptr;
  ErrorInfo created = TryCreateClient({StringOption("platform_name", "cpu")}, &as_cpu);
  ASSERT_EQ(created.code, PJRT_Error_Code_OK) << created.message;
  EXPECT_NE(serialize(as_cpu), four);

  PJRT_TopologyDescription_Deserialize_Args back{};
  back.struct_size = PJRT_TopologyDescription_Deserialize_Args_STRUCT_SIZE;
  back.serialized_topology = four.data();
  back.serialized_topology_size = four.size();
  ErrorInfo refused = Info(api->PJRT_TopologyDescription_Deserialize(&back));
  EXPECT_EQ(refused.code, PJRT_Error_Code_UNIMPLEMENTED);
  EXPECT_NE(refused.message.find("PJRT_Client_TopologyDescription"), std::string::npos)
      << refused.message;
}

TEST_F(SerializationTest, RoundTripInTheSameClientEqualsDirect) {
  PJRT_Client* client = CreateClient(4);
  PJRT_Device* device = Device(client, 2);
  PJRT_LoadedExecutable* exe = CompileAdd(client, 2);
  std::vector<PJRT_Buffer*> inputs = {Upload(client, device, a_), Upload(client, device, b_)};
  EXPECT_EQ(Run(exe, inputs), expected_);
  const std::string bytes = Serialize(exe);
  const int64_t loads = Counter("backend_loads");
  const int64_t compiles = Counter("backend_compiles");
  PJRT_LoadedExecutable* loaded = nullptr;
  ErrorInfo info = TryLoad(client, bytes, &loaded);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  EXPECT_EQ(OnlyDevice(loaded), device);
  EXPECT_EQ(Run(loaded, inputs), expected_);
  // The inner executable was loaded, not compiled again.
  EXPECT_EQ(Counter("backend_loads"), loads + 1);
  EXPECT_EQ(Counter("backend_compiles"), compiles);
  // Written again from the loaded one (the inner bytes it came from), and loaded again.
  PJRT_LoadedExecutable* again = nullptr;
  info = TryLoad(client, Serialize(loaded), &again);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  EXPECT_EQ(Run(again, inputs), expected_);
}

// The same program for each of 4 identical physical devices: compiled once, loaded onto the
// other three (create option share_compiles, on by default); each runs on its own device with
// the right result, and one of the loaded ones serializes and loads again (the bytes it was
// loaded from, not the CPU plugin's re-serialization without kernels). Off: one compile each.
TEST_F(SerializationTest, OneProgramForIdenticalDevicesIsCompiledOnceAndLoadedOnTheOthers) {
  PJRT_Client* client = CreateClient(4);
  const int64_t compiles = Counter("backend_compiles");
  const int64_t shared = Counter("shared_loads");
  std::vector<PJRT_LoadedExecutable*> exes;
  for (int k = 0; k < 4; ++k) exes.push_back(CompileAdd(client, k));
  EXPECT_EQ(Counter("backend_compiles"), compiles + 1);
  EXPECT_EQ(Counter("shared_loads"), shared + 3);
  for (int k = 0; k < 4; ++k) {
    PJRT_Device* device = Device(client, k);
    EXPECT_EQ(OnlyDevice(exes[k]), device) << "executable " << k;
    EXPECT_EQ(Run(exes[k], {Upload(client, device, a_), Upload(client, device, b_)}), expected_)
        << "on device " << k;
  }
  PJRT_Client* reader = CreateClient(4);
  const int64_t loads = Counter("backend_loads");
  PJRT_LoadedExecutable* loaded = nullptr;
  ErrorInfo info = TryLoad(reader, Serialize(exes[3]), &loaded);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  EXPECT_EQ(Counter("backend_loads"), loads + 1);
  PJRT_Device* device = Device(reader, 3);
  EXPECT_EQ(OnlyDevice(loaded), device);
  EXPECT_EQ(Run(loaded, {Upload(reader, device, a_), Upload(reader, device, b_)}), expected_);

  PJRT_Client* unshared = nullptr;
  info = TryCreateClient(
      {IntOption("num_virtual_devices", 4), StringOption("share_compiles", "false")}, &unshared);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  const int64_t before = Counter("backend_compiles");
  const int64_t shared_before = Counter("shared_loads");
  CompileAdd(unshared, 0);
  CompileAdd(unshared, 1);
  EXPECT_EQ(Counter("backend_compiles"), before + 2);
  EXPECT_EQ(Counter("shared_loads"), shared_before);
}

TEST_F(SerializationTest, LoadsIntoAClientWithAnotherPolicyAndDeviceCount) {
  PJRT_Client* writer = CreateClient(4);
  PJRT_LoadedExecutable* exe = CompileAdd(writer, 3);
  const std::string bytes = Serialize(exe);
  PJRT_Client* reader = nullptr;
  ErrorInfo info = TryCreateClient(
      {IntOption("num_virtual_devices", 8), StringOption("policy", "dynamic")}, &reader);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  PJRT_LoadedExecutable* loaded = nullptr;
  info = TryLoad(reader, bytes, &loaded);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  PJRT_Device* device = Device(reader, 3);
  EXPECT_EQ(OnlyDevice(loaded), device);
  EXPECT_EQ(Run(loaded, {Upload(reader, device, a_), Upload(reader, device, b_)}), expected_);
}

TEST_F(SerializationTest, PortableExecutablesLoadPortableAndAsPinnedWhereWanted) {
  PJRT_Client* writer = nullptr;
  ErrorInfo info = TryCreateClient({IntOption("num_virtual_devices", 4),
                                    StringOption("single_device_compile", "portable")},
                                   &writer);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  const std::string bytes = Serialize(CompileAdd(writer, 2));
  // A portable client loads the portable variant and runs it where it is placed.
  PJRT_Client* portable = nullptr;
  info = TryCreateClient({IntOption("num_virtual_devices", 4),
                          StringOption("single_device_compile", "portable")},
                         &portable);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  int64_t loads = Counter("backend_loads");
  PJRT_LoadedExecutable* loaded = nullptr;
  info = TryLoad(portable, bytes, &loaded);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  EXPECT_EQ(Counter("backend_loads"), loads + 1);
  PJRT_Device* device = Device(portable, 2);
  EXPECT_EQ(Run(loaded, {Upload(portable, device, a_), Upload(portable, device, b_)}), expected_);
  // A pinned client wants a pinned variant the envelope lacks: compiled from the program.
  PJRT_Client* pinned = nullptr;
  info = TryCreateClient({IntOption("num_virtual_devices", 4),
                          StringOption("single_device_compile", "pinned")},
                         &pinned);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  const int64_t compiles = Counter("backend_compiles");
  info = TryLoad(pinned, bytes, &loaded);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  EXPECT_EQ(Counter("backend_compiles"), compiles + 1);
  device = Device(pinned, 2);
  EXPECT_EQ(OnlyDevice(loaded), device);
  EXPECT_EQ(Run(loaded, {Upload(pinned, device, a_), Upload(pinned, device, b_)}), expected_);
}

TEST_F(SerializationTest, AProgramForADeviceTheClientLacksIsRejectedByName) {
  PJRT_Client* writer = CreateClient(8);
  const std::string bytes = Serialize(CompileAdd(writer, 6));
  PJRT_Client* reader = CreateClient(4);
  PJRT_LoadedExecutable* loaded = nullptr;
  ErrorInfo info = TryLoad(reader, bytes, &loaded);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("PJRT_Executable_DeserializeAndLoad"), std::string::npos);
  EXPECT_NE(info.message.find("virtual device id 6"), std::string::npos) << info.message;
}

TEST_F(SerializationTest, HandWrittenEnvelopeFromAnotherInnerBuildIsCompiledFromItsProgram) {
  PJRT_Client* client = CreateClient(4);
  const int64_t compiles = Counter("backend_compiles");
  PJRT_LoadedExecutable* loaded = nullptr;
  ErrorInfo info = TryLoad(client, Envelope(2, "flexnpu 0.0.9 over cpu (another build)", "cpu", 1),
                           &loaded);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  PJRT_Device* device = Device(client, 1);
  EXPECT_EQ(OnlyDevice(loaded), device);
  EXPECT_EQ(Run(loaded, {Upload(client, device, a_), Upload(client, device, b_)}), expected_);
  EXPECT_EQ(Counter("backend_compiles"), compiles + 1);
}

TEST_F(SerializationTest, AnotherPhysicalPlatformOrFormatIsRejectedNamingIt) {
  PJRT_Client* client = CreateClient(4);
  PJRT_LoadedExecutable* loaded = nullptr;
  ErrorInfo info = TryLoad(client, Envelope(2, "flexnpu 0.1.0 over cuda", "cuda", 0), &loaded);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("physical platform 'cuda'"), std::string::npos) << info.message;
  EXPECT_NE(info.message.find("runs over 'cpu'"), std::string::npos) << info.message;

  info = TryLoad(client, Envelope(3, "x", "cpu", 0), &loaded);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("FlexNPU executable format 3; this FlexNPU reads format 2"),
            std::string::npos) << info.message;

  // What FlexNPU wrote before the whole-envelope checksum: refused by its format, not parsed.
  info = TryLoad(client, Format1Envelope(Payload("x", "cpu", 0)), &loaded);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("FlexNPU executable format 1; this FlexNPU reads format 2"),
            std::string::npos) << info.message;
  EXPECT_NE(info.message.find("recompile it"), std::string::npos) << info.message;
}

class CorruptionTest : public SerializationTest {
 public:
  // `bad` is refused with INVALID_ARGUMENT naming the call and `damage`.
  void ExpectDamage(PJRT_Client* client, const std::string& bad, const std::string& damage,
                    const std::string& what) {
    PJRT_LoadedExecutable* loaded = nullptr;
    ErrorInfo info = TryLoad(client, bad, &loaded);
    EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT) << what << ": " << info.message;
    EXPECT_NE(info.message.find("PJRT_Executable_DeserializeAndLoad: serialized executable: "),
              std::string::npos) << what << ": " << info.message;
    EXPECT_NE(info.message.find(damage), std::string::npos) << what << ": " << info.message;
    EXPECT_NE(info.message.find("the bytes are "), std::string::npos)
        << what << ": " << info.message;
  }

  // Every bit of every byte at `positions` flipped, one at a time.
  void ExpectEveryFlipRejected(PJRT_Client* client, const std::string& bytes,
                               const std::vector<size_t>& positions) {
    for (size_t at : positions) {
      for (int bit = 0; bit < 8; ++bit) {
        ExpectDamage(client, Flipped(bytes, at, bit), DamageFor(at),
                     "bit " + std::to_string(bit) + " of byte " + std::to_string(at) + " of " +
                         std::to_string(bytes.size()));
      }
    }
  }

  // Cut to every length up to the header and a little beyond, then at fixed fractions; bytes
  // appended.
  void ExpectEveryCutAndExtensionRejected(PJRT_Client* client, const std::string& bytes) {
    std::vector<size_t> lengths;
    for (size_t n = 1; n <= kHeaderSize + 8; ++n) lengths.push_back(n);
    for (size_t n : {bytes.size() / 4, bytes.size() / 2, bytes.size() - kHeaderSize,
                     bytes.size() - 1}) {
      lengths.push_back(n);
    }
    for (size_t n : lengths) {
      const std::string what = "truncated to " + std::to_string(n) + " of " +
                               std::to_string(bytes.size());
      if (n < kHeaderSize) {
        ExpectDamage(client, bytes.substr(0, n), "truncated to " + std::to_string(n) +
                     " bytes, inside its 34-byte header", what);
      } else {
        ExpectDamage(client, bytes.substr(0, n), "checksum mismatch", what);
        ExpectDamage(client, bytes.substr(0, n), "(truncated?)", what);
      }
    }
    for (const std::string& tail : {std::string(1, '\0'), std::string("x"), std::string(4096, 'y')}) {
      const std::string what = std::to_string(tail.size()) + " bytes appended";
      ExpectDamage(client, bytes + tail, "checksum mismatch", what);
      ExpectDamage(client, bytes + tail, "(bytes appended?)", what);
    }
  }
};

// A hand-written envelope: the same bytes every run, so every bit of it is flipped.
TEST_F(CorruptionTest, EveryBitOfAHandWrittenEnvelopeIsChecked) {
  PJRT_Client* client = CreateClient(4);
  const std::string bytes = Envelope(2, "flexnpu 0.0.9 over cpu (another build)", "cpu", 1);
  PJRT_LoadedExecutable* loaded = nullptr;
  ErrorInfo info = TryLoad(client, bytes, &loaded);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  std::vector<size_t> every(bytes.size());
  for (size_t i = 0; i < every.size(); ++i) every[i] = i;
  ExpectEveryFlipRejected(client, bytes, every);
  ExpectEveryCutAndExtensionRejected(client, bytes);
}

// A written one (inner executable included): every bit of its header, of its last 16 bytes
// (where format 1's checksum lay) and of every 61st byte of its payload.
TEST_F(CorruptionTest, CorruptTruncatedOrExtendedBytesAreInvalidArgument) {
  PJRT_Client* client = CreateClient(4);
  const std::string bytes = Serialize(CompileAdd(client, 0));
  ASSERT_GT(bytes.size(), 1000u);
  std::vector<size_t> positions;
  for (size_t i = 0; i < kHeaderSize; ++i) positions.push_back(i);
  for (size_t i = kHeaderSize; i < bytes.size() - 16; i += 61) positions.push_back(i);
  for (size_t i = bytes.size() - 16; i < bytes.size(); ++i) positions.push_back(i);
  ExpectEveryFlipRejected(client, bytes, positions);
  ExpectEveryCutAndExtensionRejected(client, bytes);

  ExpectDamage(client, "flexnpu-exe", "truncated to 11 bytes", "a cut magic");
  PJRT_LoadedExecutable* loaded = nullptr;
  ErrorInfo info = TryLoad(client, "not an executable", &loaded);
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("not a FlexNPU serialized executable"), std::string::npos)
      << info.message;
  PJRT_Executable_DeserializeAndLoad_Args args{};
  args.struct_size = PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE;
  args.client = client;
  info = Info(api->PJRT_Executable_DeserializeAndLoad(&args));
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("null or empty"), std::string::npos) << info.message;
}

// One flipped bit turns the program's "return %1" into "return %0": a valid program that
// returns a + b instead of (a + b) * b. Sealed again it parses and loads as that other
// program; as it was damaged, the checksum refuses it before anything is parsed.
TEST_F(CorruptionTest, TheEnvelopeIsCheckedBeforeItsPayloadIsParsed) {
  PJRT_Client* client = CreateClient(4);
  PJRT_Device* device = Device(client, 1);
  const std::string payload = Payload("flexnpu 0.0.9 over cpu (another build)", "cpu", 1);
  const std::string bytes = Seal(2, payload);
  const size_t in_payload = payload.find("return %1");
  ASSERT_NE(in_payload, std::string::npos);
  const size_t at = kHeaderSize + in_payload + std::string("return %").size();
  const std::string damaged = Flipped(bytes, at, 0);
  ASSERT_NE(damaged.find("return %0"), std::string::npos);

  PJRT_LoadedExecutable* loaded = nullptr;
  ErrorInfo info = TryLoad(client, bytes, &loaded);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  EXPECT_EQ(Run(loaded, {Upload(client, device, a_), Upload(client, device, b_)}), expected_);

  info = TryLoad(client, Seal(2, damaged.substr(kHeaderSize)), &loaded);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  EXPECT_EQ(Run(loaded, {Upload(client, device, a_), Upload(client, device, b_)}),
            (std::vector<float>{11, 22, 33, 44}));

  const uint32_t stored = static_cast<uint32_t>(ReadLittleEndian(bytes, kChecksumAt, 4));
  char expected_message[96];
  std::snprintf(expected_message, sizeof(expected_message),
                "checksum mismatch (stored 0x%08x, computed 0x%08x over its %zu bytes)", stored,
                Crc32c(damaged.substr(0, kChecksumAt) + damaged.substr(kHeaderSize)),
                damaged.size());
  ExpectDamage(client, damaged, expected_message, "return %1 -> return %0");
}

// FlexNPU's own fields are deterministic: an executable serializes to the same bytes each
// time, a loaded one to the bytes it was loaded from, and the header is the documented one.
// (Two compiles of one program need not give equal bytes: the XLA CPU plugin's own
// serialization embeds a per-process module id and writes protobuf maps in hash order.)
TEST_F(SerializationTest, AnExecutableSerializesToTheSameBytesEachTime) {
  PJRT_Client* client = CreateClient(4);
  PJRT_LoadedExecutable* exe = CompileAdd(client, 2);
  const std::string bytes = Serialize(exe);
  EXPECT_EQ(Serialize(exe), bytes);
  PJRT_LoadedExecutable* loaded = nullptr;
  ErrorInfo info = TryLoad(client, bytes, &loaded);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  EXPECT_EQ(Serialize(loaded), bytes);
  PJRT_Client* other = CreateClient(4);
  info = TryLoad(other, bytes, &loaded);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  EXPECT_EQ(Serialize(loaded), bytes);

  ASSERT_GT(bytes.size(), kHeaderSize);
  EXPECT_EQ(bytes.substr(0, kMagicSize), "flexnpu-executable");
  EXPECT_EQ(ReadLittleEndian(bytes, kMagicSize, 4), 2u);
  EXPECT_EQ(ReadLittleEndian(bytes, kMagicSize + 4, 8), bytes.size() - kHeaderSize);
  EXPECT_EQ(ReadLittleEndian(bytes, kChecksumAt, 4),
            Crc32c(bytes.substr(0, kChecksumAt) + bytes.substr(kHeaderSize)));
}

}  // namespace
