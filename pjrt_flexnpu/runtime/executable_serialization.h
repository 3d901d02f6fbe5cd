// Executable serialization: PJRT_Executable_Serialize writes a versioned FlexNPU envelope,
// PJRT_Executable_DeserializeAndLoad rebuilds a VirtualLoadedExecutable from it.
//
// Envelope (format 2): a fixed header, then the payload.
//   bytes  0..17  magic "flexnpu-executable"
//   bytes 18..21  format version, uint32 little-endian
//   bytes 22..29  payload size in bytes, uint64 little-endian
//   bytes 30..33  CRC-32C (base/crc32c.h) of every other byte of the envelope (header and
//                 payload), uint32 little-endian
//   bytes 34..    payload: protobuf wire format (base/wire.h; field numbers in
//                 serialization_fields below)
// The header's layout is the same for every format from 2 on, so the checksum is verified
// before anything else is read, the version included: a flipped bit anywhere, a truncation or
// appended bytes are INVALID_ARGUMENT naming the damage, and corrupt bytes are never parsed
// (a bit flipped in the program text would otherwise load as another program). Format 1 (a
// protobuf envelope whose checksum covered only the body, so bits of its header, such as the
// ignored high bits of the checksum's 10-byte varint, could flip unnoticed) is refused by name.
//
// Payload: the FlexNPU platform version it was written under (FlexNPU, physical platform and
// version, PJRT C API, backend build), the physical platform name, the original program
// (format + bytes), the compile options as JAX gave them (virtual device assignment), the
// analysis profile, and the inner backend's serialized executables of the variants compiled
// so far, each with its physical mapping (backend device ids; none: portable).
//
// On load the executable is rebuilt for this process' policy and device count exactly as a
// compile would build it; every variant it wants whose mapping is in the envelope is loaded by
// the inner plugin instead of compiled, the others are compiled from the program (now or
// lazily). Inner bytes are only used under the same platform version (the same inner build); a
// program written over another physical platform is rejected.
//
// Byte stability: FlexNPU's own fields are written in a fixed order from deterministic values,
// so one executable serializes to the same bytes every time, and a loaded one to the bytes it
// was loaded from. Two compiles of one program need not: the XLA CPU plugin's serialized
// executable embeds the HLO module's id (a per-process counter of compiled modules) and XLA's
// debug options, whose protobuf map fields are written in hash order (another each process).
#ifndef FLEXNPU_RUNTIME_EXECUTABLE_SERIALIZATION_H_
#define FLEXNPU_RUNTIME_EXECUTABLE_SERIALIZATION_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu {

class VirtualClient;
class VirtualLoadedExecutable;
struct PrebuiltVariants;

// Bumped whenever the envelope changes meaning; part of the platform version JAX's cache key
// hashes, so entries of another format are never even looked up.
inline constexpr uint32_t kExecutableFormatVersion = 2;

// What PJRT_Executable_Serialize writes for one loaded executable: taken when JAX asks for the
// executable view (PJRT_LoadedExecutable_GetExecutable), so it outlives the loaded executable.
struct SerializableExecutable {
  struct Variant {
    std::vector<int64_t> physical_ids;  // backend device ids by position; empty: portable
    // Owns `executable` while the loaded executable keeps the variant (not longer: inner
    // executables must not outlive the client).
    std::weak_ptr<const void> compiled;
    PJRT_LoadedExecutable* executable = nullptr;
    // The inner bytes it was loaded from (an envelope's, or those shared by SharedCompiles),
    // when it was: written again as they are, because the XLA CPU plugin re-serializes a
    // deserialized executable without its kernels.
    std::shared_ptr<const void> source;
    const std::string* loaded_from = nullptr;  // in `source`
  };
  std::shared_ptr<const PhysicalBackend> backend;
  std::string platform_version;  // VirtualClient::platform_version()
  std::string backend_platform;
  std::string program_format;
  std::string program_code;
  std::string compile_options;  // as JAX gave them
  placement::Profile profile;
  std::vector<Variant> variants;
};

// Inner serialized executables from an envelope, by physical mapping (empty: portable), for
// VirtualLoadedExecutable::Compile to load instead of compiling.
struct PrebuiltVariants {
  std::map<std::vector<int64_t>, std::string> by_mapping;
  bool has_profile = false;
  placement::Profile profile;
};

// "backend build <hash of the inner plugin file's path, size and mtime>, executable format N":
// part of the platform version, so a reinstalled or other inner plugin changes it.
std::string SerializationIdentity(const PhysicalBackend& backend);

StatusOr<std::string> SerializeExecutable(const SerializableExecutable& executable);

// `overridden_options` (may be empty: use the envelope's) are the compile options JAX loads
// the executable for; inner variants are reused only when they equal the envelope's.
StatusOr<VirtualLoadedExecutable*> DeserializeAndLoadExecutable(
    VirtualClient* client, std::string_view serialized, std::string_view overridden_options);

// The inner executable for `physical` (client physical device indices; empty: portable) loaded
// from `prebuilt`, or nullptr when the envelope has none for that mapping. The loaded one is
// checked to run on exactly those devices. `options` are the inner compile options this load
// stands for (the ones a compile for `physical` would get): the inner plugin loads with them,
// so its debug options (e.g. xla_dump_to) are this load's, not those of the first compile.
StatusOr<InnerLoadedExecutable> LoadPrebuiltVariant(const PrebuiltVariants& prebuilt,
                                                    const VirtualClient& client,
                                                    const std::vector<int>& physical,
                                                    std::string_view options);

namespace serialization_fields {  // the payload
inline constexpr uint32_t kPlatformVersion = 1;
inline constexpr uint32_t kBackendPlatform = 2;
inline constexpr uint32_t kProgramFormat = 3;
inline constexpr uint32_t kProgramCode = 4;
inline constexpr uint32_t kCompileOptions = 5;
inline constexpr uint32_t kProfile = 6;
inline constexpr uint32_t kVariant = 7;            // repeated
inline constexpr uint32_t kProfilePhase = 1;       // profile
inline constexpr uint32_t kProfileFlops = 2;       // double, bit pattern as varint
inline constexpr uint32_t kProfileBytes = 3;       // double, bit pattern as varint
inline constexpr uint32_t kProfileMemoryBytes = 4;
inline constexpr uint32_t kVariantPhysicalIds = 1;  // variant: packed int64
inline constexpr uint32_t kVariantPortable = 2;
inline constexpr uint32_t kVariantInner = 3;        // the inner plugin's serialized bytes
}  // namespace serialization_fields

inline constexpr std::string_view kExecutableMagic = "flexnpu-executable";

// The header (see the top of this file): offsets of its fields, and its size.
namespace envelope_header {
inline constexpr size_t kVersionAt = kExecutableMagic.size();
inline constexpr size_t kPayloadSizeAt = kVersionAt + 4;
inline constexpr size_t kChecksumAt = kPayloadSizeAt + 8;
inline constexpr size_t kSize = kChecksumAt + 4;
}  // namespace envelope_header

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_EXECUTABLE_SERIALIZATION_H_
