#include "pjrt_flexnpu/runtime/executable_serialization.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <utility>

#include "pjrt_flexnpu/backend/compile_options.h"
#include "pjrt_flexnpu/base/crc32c.h"
#include "pjrt_flexnpu/base/wire.h"
#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/executable.h"

namespace flexnpu {
namespace {

namespace f = serialization_fields;
namespace h = envelope_header;

// Format 1 began with the magic as protobuf field 1 (tag 0x0a, length 18).
constexpr std::string_view kFormat1Prefix = "\x0a\x12" "flexnpu-executable";

void PutLittleEndian(std::string* out, uint64_t value, int width) {
  for (int i = 0; i < width; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t GetLittleEndian(std::string_view data, size_t at, int width) {
  uint64_t value = 0;
  for (int i = 0; i < width; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(data[at + i])) << (8 * i);
  }
  return value;
}

// The checksum the header stores: every byte of the envelope but the checksum's own four.
uint32_t EnvelopeChecksum(std::string_view envelope) {
  return Crc32cExtend(Crc32c(envelope.substr(0, h::kChecksumAt)), envelope.substr(h::kSize));
}

std::string Hex32(uint32_t value) {
  char hex[11];
  std::snprintf(hex, sizeof(hex), "0x%08x", value);
  return hex;
}

uint64_t DoubleBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double BitsDouble(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Damage the envelope check found (before anything was parsed).
Status Damaged(const std::string& what) {
  return InvalidArgument("PJRT_Executable_DeserializeAndLoad: serialized executable: " + what);
}

// A payload that passed the checksum but does not parse: only a writer's bug or crafted bytes.
Status Corrupt(const std::string& what) {
  return Damaged("malformed payload (" + what + ") although its checksum matches: written by "
                 "a faulty writer?");
}

// The inner plugin's serialization of one loaded executable.
StatusOr<std::string> SerializeInner(const PhysicalBackend& b, PJRT_LoadedExecutable* loaded) {
  FLEXNPU_ASSIGN_OR_RETURN(const InnerExecutable unloaded, b.GetExecutable(loaded));
  return b.Serialize(unloaded.get());
}

struct ParsedVariant {
  std::vector<int64_t> physical_ids;
  bool portable = false;
  std::string_view inner;
};

struct ParsedEnvelope {
  std::string_view platform_version;
  std::string_view backend_platform;
  std::string_view program_format;
  std::string_view program_code;
  std::string_view compile_options;
  bool has_profile = false;
  placement::Profile profile;
  std::vector<ParsedVariant> variants;
};

bool IsBytes(const proto::Field& field) {
  return field.type == proto::WireType::kLengthDelimited;
}

Status ParseProfile(std::string_view data, placement::Profile* profile) {
  proto::Reader reader(data);
  proto::Field field;
  while (reader.Next(&field)) {
    if (field.type != proto::WireType::kVarint) return Corrupt("profile field type");
    switch (field.number) {
      case f::kProfilePhase:
        if (field.value >= static_cast<uint64_t>(placement::kNumPhases)) {
          return Corrupt("profile phase " + std::to_string(field.value));
        }
        profile->phase = static_cast<placement::Phase>(field.value);
        break;
      case f::kProfileFlops: profile->flops = BitsDouble(field.value); break;
      case f::kProfileBytes: profile->bytes = BitsDouble(field.value); break;
      case f::kProfileMemoryBytes: profile->memory_bytes = static_cast<int64_t>(field.value); break;
      default: break;
    }
  }
  if (!reader.ok()) return Corrupt("profile: " + reader.error());
  return Status::Ok();
}

Status ParseVariant(std::string_view data, ParsedVariant* variant) {
  proto::Reader reader(data);
  proto::Field field;
  bool has_inner = false;
  while (reader.Next(&field)) {
    switch (field.number) {
      case f::kVariantPhysicalIds:
        if (!proto::AppendVarints(field, &variant->physical_ids)) {
          return Corrupt("variant physical ids");
        }
        break;
      case f::kVariantPortable:
        if (field.type != proto::WireType::kVarint) return Corrupt("variant portable flag");
        variant->portable = field.value != 0;
        break;
      case f::kVariantInner:
        if (!IsBytes(field)) return Corrupt("variant inner executable");
        variant->inner = field.bytes;
        has_inner = true;
        break;
      default: break;
    }
  }
  if (!reader.ok()) return Corrupt("variant: " + reader.error());
  if (!has_inner) return Corrupt("a variant without its inner executable");
  if (variant->portable != variant->physical_ids.empty()) {
    return Corrupt("a variant is portable and has a physical mapping, or neither");
  }
  return Status::Ok();
}

// Verifies the header and the checksum of the whole envelope and returns its payload. Nothing
// but the magic is read before the checksum matched: the version and the payload size are
// only trusted, and the payload only parsed, once every byte is known to be as written.
StatusOr<std::string_view> CheckEnvelope(std::string_view serialized) {
  const size_t size = serialized.size();
  const std::string_view magic = serialized.substr(0, kExecutableMagic.size());
  if (magic != kExecutableMagic) {
    if (serialized.substr(0, kFormat1Prefix.size()) == kFormat1Prefix) {
      return InvalidArgument("PJRT_Executable_DeserializeAndLoad: the executable was written "
                             "in FlexNPU executable format 1; this FlexNPU reads format " +
                             std::to_string(kExecutableFormatVersion) + " (recompile it)");
    }
    if (kExecutableMagic.substr(0, size) == serialized) {
      return Damaged("truncated to " + std::to_string(size) + " bytes, inside its " +
                     std::to_string(h::kSize) + "-byte header: the bytes are incomplete");
    }
    // A few flipped bits in the magic are damage to a FlexNPU executable; anything else is
    // not one (another plugin's bytes, or none).
    int flipped = 0;
    size_t first = magic.size();
    for (size_t i = 0; i < magic.size(); ++i) {
      const unsigned diff = static_cast<unsigned char>(magic[i] ^ kExecutableMagic[i]);
      if (diff != 0 && first == magic.size()) first = i;
      for (unsigned d = diff; d != 0; d &= d - 1) ++flipped;
    }
    if (size >= h::kSize && flipped <= 3) {
      return Damaged("magic '" + std::string(kExecutableMagic) + "' damaged at byte " +
                     std::to_string(first) + " (" + std::to_string(flipped) +
                     " bit(s) differ): the bytes are corrupt");
    }
    return InvalidArgument(
        "PJRT_Executable_DeserializeAndLoad: these " + std::to_string(size) +
        " bytes are not a FlexNPU serialized executable (no '" + std::string(kExecutableMagic) +
        "' header); was it written by another PJRT plugin?");
  }
  if (size < h::kSize) {
    return Damaged("truncated to " + std::to_string(size) + " bytes, inside its " +
                   std::to_string(h::kSize) + "-byte header: the bytes are incomplete");
  }
  const uint64_t payload_size = GetLittleEndian(serialized, h::kPayloadSizeAt, 8);
  const uint64_t follows = size - h::kSize;
  const auto stored = static_cast<uint32_t>(GetLittleEndian(serialized, h::kChecksumAt, 4));
  const uint32_t computed = EnvelopeChecksum(serialized);
  if (stored != computed) {
    std::string what = "checksum mismatch (stored " + Hex32(stored) + ", computed " +
                       Hex32(computed) + " over its " + std::to_string(size) + " bytes)";
    // Where, when the header can tell: a cut or extended envelope. (A flip in the size field
    // reads the same; the checksum covers it too.)
    if (payload_size != follows) {
      what += "; its header names a payload of " + std::to_string(payload_size) + " bytes, " +
              std::to_string(follows) + " follow the header (" +
              (payload_size > follows ? "truncated" : "bytes appended") + "?)";
    }
    return Damaged(what + ": the bytes are corrupt");
  }
  const uint64_t version = GetLittleEndian(serialized, h::kVersionAt, 4);
  if (version != kExecutableFormatVersion) {
    return InvalidArgument("PJRT_Executable_DeserializeAndLoad: the executable was written in "
                           "FlexNPU executable format " + std::to_string(version) +
                           "; this FlexNPU reads format " +
                           std::to_string(kExecutableFormatVersion) + " (recompile it)");
  }
  if (payload_size != follows) {  // consistent checksum: written so
    return Damaged("its header names a payload of " + std::to_string(payload_size) +
                   " bytes, " + std::to_string(follows) + " follow the header");
  }
  return serialized.substr(h::kSize);
}

StatusOr<ParsedEnvelope> ParseEnvelope(std::string_view serialized) {
  FLEXNPU_ASSIGN_OR_RETURN(const std::string_view body, CheckEnvelope(serialized));
  proto::Field field;
  ParsedEnvelope parsed;
  bool has_program = false, has_options = false, has_platform = false;
  proto::Reader reader(body);
  while (reader.Next(&field)) {
    const bool bytes = IsBytes(field);
    switch (field.number) {
      case f::kPlatformVersion:
        if (!bytes) return Corrupt("platform version field type");
        parsed.platform_version = field.bytes;
        break;
      case f::kBackendPlatform:
        if (!bytes) return Corrupt("backend platform field type");
        parsed.backend_platform = field.bytes;
        has_platform = true;
        break;
      case f::kProgramFormat:
        if (!bytes) return Corrupt("program format field type");
        parsed.program_format = field.bytes;
        break;
      case f::kProgramCode:
        if (!bytes) return Corrupt("program field type");
        parsed.program_code = field.bytes;
        has_program = true;
        break;
      case f::kCompileOptions:
        if (!bytes) return Corrupt("compile options field type");
        parsed.compile_options = field.bytes;
        has_options = true;
        break;
      case f::kProfile:
        if (!bytes) return Corrupt("profile field type");
        FLEXNPU_RETURN_IF_ERROR(ParseProfile(field.bytes, &parsed.profile));
        parsed.has_profile = true;
        break;
      case f::kVariant: {
        if (!bytes) return Corrupt("variant field type");
        ParsedVariant variant;
        FLEXNPU_RETURN_IF_ERROR(ParseVariant(field.bytes, &variant));
        parsed.variants.push_back(std::move(variant));
        break;
      }
      default: break;
    }
  }
  if (!reader.ok()) return Corrupt(reader.error());
  if (!has_program || parsed.program_format.empty() || !has_options || !has_platform) {
    return Corrupt("the program, its format, the compile options or the platform is missing");
  }
  return parsed;
}

// True when both compile options ask for the same devices (replicas, partitions, portable,
// virtual device assignment): what FlexNPU reads of them to place and rewrite.
StatusOr<bool> SameDevicePlan(std::string_view stored, std::string_view overridden) {
  auto a = ReadCompileOptions(stored);
  if (!a.ok()) return Corrupt("compile options: " + a.status().message());
  auto b = ReadCompileOptions(overridden);
  if (!b.ok()) {
    return InvalidArgument("PJRT_Executable_DeserializeAndLoad: overridden compile options: " +
                           b.status().message());
  }
  return a->num_replicas == b->num_replicas && a->num_partitions == b->num_partitions &&
         a->compile_portable == b->compile_portable &&
         a->has_device_assignment == b->has_device_assignment && a->device_ids == b->device_ids;
}

}  // namespace

std::string SerializationIdentity(const PhysicalBackend& backend) {
  std::string identity = backend.path();
  struct stat info {};
  if (::stat(backend.path().c_str(), &info) == 0) {
    identity += ":" + std::to_string(info.st_size) + ":" + std::to_string(info.st_mtim.tv_sec) +
                "." + std::to_string(info.st_mtim.tv_nsec);
  }
  return "backend build " + Hex32(Crc32c(identity)).substr(2) + ", executable format " +
         std::to_string(kExecutableFormatVersion);
}

std::shared_ptr<const SerializableExecutable> VirtualLoadedExecutable::SerializationSnapshot() {
  auto snapshot = std::make_shared<SerializableExecutable>();
  snapshot->backend = client_->shared_backend();
  snapshot->platform_version = client_->platform_version();
  snapshot->backend_platform = client_->backend_platform();
  snapshot->program_format = variants_.program_format();
  snapshot->program_code = variants_.program_code();
  snapshot->compile_options = original_options_;
  snapshot->profile = profile_;
  const std::shared_ptr<const PrebuiltVariants>& prebuilt = variants_.prebuilt();
  for (const std::shared_ptr<CompiledVariant>& compiled : variants_.Variants()) {
    SerializableExecutable::Variant variant;
    for (int p : compiled->physical) variant.physical_ids.push_back(client_->physical(p).id);
    variant.executable = compiled->executable.get();
    variant.compiled = compiled;
    if (prebuilt != nullptr) {  // a mapping the envelope had was loaded from it, not compiled
      auto it = prebuilt->by_mapping.find(variant.physical_ids);
      if (it != prebuilt->by_mapping.end()) {
        variant.source = prebuilt;
        variant.loaded_from = &it->second;
      }
    }
    if (variant.loaded_from == nullptr && compiled->inner_bytes != nullptr) {
      variant.source = compiled->inner_bytes;  // shared with other devices' variants
      variant.loaded_from = compiled->inner_bytes.get();
    }
    snapshot->variants.push_back(std::move(variant));
  }
  return snapshot;
}

StatusOr<std::string> SerializeExecutable(const SerializableExecutable& executable) {
  proto::Writer body;
  body.Bytes(f::kPlatformVersion, executable.platform_version);
  body.Bytes(f::kBackendPlatform, executable.backend_platform);
  body.Bytes(f::kProgramFormat, executable.program_format);
  body.Bytes(f::kProgramCode, executable.program_code);
  body.Bytes(f::kCompileOptions, executable.compile_options);
  proto::Writer profile;
  profile.Varint(f::kProfilePhase, static_cast<uint64_t>(executable.profile.phase));
  profile.Varint(f::kProfileFlops, DoubleBits(executable.profile.flops));
  profile.Varint(f::kProfileBytes, DoubleBits(executable.profile.bytes));
  profile.Varint(f::kProfileMemoryBytes, static_cast<uint64_t>(executable.profile.memory_bytes));
  body.Bytes(f::kProfile, profile.str());
  for (size_t i = 0; i < executable.variants.size(); ++i) {
    const auto& variant = executable.variants[i];
    std::shared_ptr<const void> alive = variant.compiled.lock();
    if (alive == nullptr) {
      // Evicted from the mapping cache since, or the loaded executable is gone.
      if (i == 0) {
        return FailedPrecondition("PJRT_Executable_Serialize: the loaded executable this "
                                  "executable was obtained from has been destroyed");
      }
      continue;
    }
    auto inner = variant.loaded_from != nullptr
                     ? StatusOr<std::string>(*variant.loaded_from)
                     : SerializeInner(*executable.backend, variant.executable);
    if (!inner.ok()) {
      return Status(inner.status().code(),
                    "PJRT_Executable_Serialize: the physical backend could not serialize a "
                    "compiled variant: " + inner.status().message());
    }
    proto::Writer v;
    if (!variant.physical_ids.empty()) v.PackedVarints(f::kVariantPhysicalIds, variant.physical_ids);
    v.Bool(f::kVariantPortable, variant.physical_ids.empty());
    v.Bytes(f::kVariantInner, *inner);
    body.Bytes(f::kVariant, v.str());
  }
  const std::string payload = body.Take();
  std::string envelope;
  envelope.reserve(h::kSize + payload.size());
  envelope.append(kExecutableMagic);
  PutLittleEndian(&envelope, kExecutableFormatVersion, 4);
  PutLittleEndian(&envelope, payload.size(), 8);
  const uint32_t checksum = Crc32cExtend(Crc32c(envelope), payload);
  PutLittleEndian(&envelope, checksum, 4);
  envelope.append(payload);
  return envelope;
}

StatusOr<VirtualLoadedExecutable*> DeserializeAndLoadExecutable(
    VirtualClient* client, std::string_view serialized, std::string_view overridden_options) {
  auto parsed = ParseEnvelope(serialized);
  if (!parsed.ok()) return parsed.status();
  if (parsed->backend_platform != client->backend_platform()) {
    return InvalidArgument("PJRT_Executable_DeserializeAndLoad: the executable was compiled "
                           "over physical platform '" + std::string(parsed->backend_platform) +
                           "'; this FlexNPU client runs over '" + client->backend_platform() +
                           "' (recompile it)");
  }
  std::string_view options = parsed->compile_options;
  bool same_options = true;
  if (!overridden_options.empty()) {
    auto same = SameDevicePlan(parsed->compile_options, overridden_options);
    if (!same.ok()) return same.status();
    same_options = *same;
    // The executable is rebuilt with the options JAX loads it for, not the first compile's:
    // they may differ in more than the device plan (debug options such as xla_dump_to, which
    // the inner plugin honours when it loads a variant). Inner variants are reused only for the
    // same device plan (JAX re-serializes equal options with other bytes, so not byte-equal).
    options = overridden_options;
  }
  auto prebuilt = std::make_shared<PrebuiltVariants>();
  // Inner bytes are only valid for the inner build that wrote them, and only for the device
  // plan they were compiled for; otherwise everything is compiled again from the program.
  if (parsed->platform_version == client->platform_version() && same_options) {
    prebuilt->has_profile = parsed->has_profile;
    prebuilt->profile = parsed->profile;
    for (const ParsedVariant& variant : parsed->variants) {
      prebuilt->by_mapping[variant.physical_ids] = std::string(variant.inner);
    }
  }
  PJRT_Program program{};
  program.struct_size = PJRT_Program_STRUCT_SIZE;
  program.code = const_cast<char*>(parsed->program_code.data());
  program.code_size = parsed->program_code.size();
  program.format = parsed->program_format.data();
  program.format_size = parsed->program_format.size();
  auto loaded = VirtualLoadedExecutable::Compile(client, &program, options, std::move(prebuilt));
  if (!loaded.ok()) {
    return Status(loaded.status().code(), "PJRT_Executable_DeserializeAndLoad: rebuilding the "
                                          "executable failed: " + loaded.status().message());
  }
  return loaded;
}

StatusOr<InnerLoadedExecutable> LoadPrebuiltVariant(const PrebuiltVariants& prebuilt,
                                                    const VirtualClient& client,
                                                    const std::vector<int>& physical,
                                                    std::string_view options) {
  std::vector<int64_t> ids;
  for (int p : physical) ids.push_back(client.physical(p).id);
  auto it = prebuilt.by_mapping.find(ids);
  if (it == prebuilt.by_mapping.end()) return InnerLoadedExecutable();
  const PhysicalBackend& b = client.backend();
  FLEXNPU_ASSIGN_OR_RETURN(InnerLoadedExecutable loaded,
                           b.DeserializeAndLoad(client.inner(), it->second, options));
  if (physical.empty()) return loaded;  // portable: runs wherever it is told
  // A pinned variant must run on exactly the devices of its mapping.
  if (!RunsOnExactly(client, loaded.get(), physical)) {
    return InvalidArgument("PJRT_Executable_DeserializeAndLoad: the physical backend loaded a "
                           "compiled variant onto other devices than its mapping names");
  }
  return loaded;
}

}  // namespace flexnpu
