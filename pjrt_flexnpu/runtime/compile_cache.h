// The compiled variants of one virtual executable's program. A program over N virtual devices
// is compiled for a mapping onto N distinct physical devices (the device assignment rewritten
// to physical ids), once per mapping the placer uses, cached. Single-device programs can
// instead be compiled once, portable, and run on whichever physical device the placer picks
// (option single_device_compile=portable). Across executables, a program compiled for some
// physical devices is loaded onto other devices of the same kinds instead of compiled again
// (SharedCompiles, create option share_compiles).
#ifndef FLEXNPU_RUNTIME_COMPILE_CACHE_H_
#define FLEXNPU_RUNTIME_COMPILE_CACHE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"

namespace flexnpu {

class VirtualClient;
struct PrebuiltVariants;  // runtime/executable_serialization.h

// One inner loaded executable and the physical devices it was compiled for.
struct CompiledVariant {
  InnerLoadedExecutable executable;
  std::vector<int> physical;        // physical device per position (empty when portable)
  std::vector<int> inner_position;  // position in the inner executable's device list
  // The inner serialization it was compiled to or loaded from, when shared (SharedCompiles):
  // written again as it is by PJRT_Executable_Serialize, because the XLA CPU plugin
  // re-serializes a deserialized executable without its kernels.
  std::shared_ptr<const std::string> inner_bytes;
  // When an execution last used it (the cache's use clock): set on the fast path too, which
  // skips the map, so eviction sees real use.
  std::atomic<uint64_t> last_use{0};
};

// Inner executables compiled once per client and loaded (PJRT_Executable_DeserializeAndLoad
// with the device assignment rewritten) onto the other physical devices of the same kinds that
// need the same program with the same options: N identical devices cost one compile. Keyed by
// the program, its compile options without the device assignment, and the devices' kinds;
// bounded in bytes (the oldest entries are dropped). Only compiles touch it.
class SharedCompiles {
 public:
  using Bytes = std::shared_ptr<const std::string>;

  // The first compile of a key: the callers that look the key up meanwhile wait for Publish
  // (or for the claim's end without it: then they compile themselves).
  class Claim {
   public:
    Claim(SharedCompiles* owner, std::string key) : owner_(owner), key_(std::move(key)) {}
    Claim(const Claim&) = delete;
    Claim& operator=(const Claim&) = delete;
    ~Claim() { Publish(nullptr); }
    // The serialized inner executable (null: it could not be serialized, nothing shared).
    void Publish(Bytes bytes);

   private:
    friend class SharedCompiles;
    SharedCompiles* owner_;
    std::string key_;
    std::promise<Bytes> promise_;
  };

  // What a compile of `key` finds: the bytes of an earlier compile (waited for when it is in
  // progress; null when it published none), or, for the first, the claim to fulfil.
  struct Found {
    Bytes bytes;
    std::unique_ptr<Claim> claim;
  };
  Found Find(std::string key);

  // The key of a program compiled with `options_without_assignment` for devices of `kinds`.
  static std::string KeyOf(std::string_view program_format, std::string_view program_code,
                           std::string_view options_without_assignment,
                           const std::vector<std::string>& kinds);

 private:
  struct Entry {
    std::shared_future<Bytes> bytes;
    uint64_t order = 0;  // insertion order: the oldest is dropped first
    size_t size = 0;     // 0 until published
  };
  void Resolve(const std::string& key, std::promise<Bytes>& promise, const Bytes& bytes);

  static constexpr size_t kMaxBytes = size_t{256} << 20;
  std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  uint64_t next_order_ = 0;
  size_t total_bytes_ = 0;
};

// Whether `loaded` runs on exactly the client's physical devices `physical`.
bool RunsOnExactly(const VirtualClient& client, PJRT_LoadedExecutable* loaded,
                   const std::vector<int>& physical);

class CompileCache {
 public:
  explicit CompileCache(VirtualClient* client) : client_(client) {}

  // Keeps the program for the compiles of further mappings. `portable`: every compile is the
  // portable one (single_device_compile=portable). `portable_fallback`: single_device_compile=
  // auto under a placing policy: an execution placed off its home device runs a variant pinned
  // to the device it was placed on (compiled on the first placement there; the fast execute
  // path); the portable compile, made on first need, is only the fallback when the backend
  // cannot compile that pinned variant. `prebuilt` (deserialized): inner executables loaded
  // instead of compiled for the mappings it has.
  Status Configure(const PJRT_Program* program, std::string_view compile_options, bool portable,
                   bool portable_fallback, std::shared_ptr<const PrebuiltVariants> prebuilt);
  // Compiles the variant for `mapping` (empty: the portable compile), the one kept for good.
  Status CompileInitial(const std::vector<int>& mapping);

  bool portable() const { return portable_; }
  bool portable_fallback() const { return portable_fallback_; }
  const std::shared_ptr<CompiledVariant>& initial() const { return initial_; }
  const std::string& program_code() const { return program_code_; }
  const std::string& program_format() const { return program_format_; }
  const std::shared_ptr<const PrebuiltVariants>& prebuilt() const { return prebuilt_; }

  // The cached variant for a mapping (n physical devices; n == 0: the portable compile),
  // compiled here, outside mu_, on first need.
  StatusOr<std::shared_ptr<CompiledVariant>> For(const int* physical, size_t n);
  // The pinned compile for `physical_device` failed and `portable` ran instead: cached as that
  // device's variant, so later executions there take it without compiling (and failing) again.
  void RememberFallback(int physical_device, const std::shared_ptr<CompiledVariant>& portable);
  // Mappings with a compiled variant in the cache (for tests and stats).
  size_t num_cached_mappings();
  // The initial variant (when there is one), then every other compiled one in the map.
  std::vector<std::shared_ptr<CompiledVariant>> Variants();
  // Deletes the inner executable of every variant, the recent one included.
  Status DeleteAll();

 private:
  using CompiledResult = StatusOr<std::shared_ptr<CompiledVariant>>;
  // One mapping's compile: shared by every execution that wants it while it runs.
  struct CacheEntry {
    std::shared_future<CompiledResult> compiled;
    uint64_t last_use = 0;
  };

  CompiledResult CompileFor(const std::vector<int>& physical);
  // Compiles for `physical` with `options`, or loads what another executable compiled for
  // devices of the same kinds (SharedCompiles).
  StatusOr<InnerLoadedExecutable> CompileOrShare(const std::vector<int>& physical,
                                                 const PJRT_Program& program,
                                                 const std::string& options,
                                                 std::shared_ptr<const std::string>* inner_bytes);
  void EvictLocked();
  static uint64_t LastUse(const CacheEntry& entry);
  // Makes `compiled` (a variant pinned to `physical_device`) the recent one.
  void Remember(int physical_device, const std::shared_ptr<CompiledVariant>& compiled);

  VirtualClient* client_;
  bool portable_ = false;
  bool portable_fallback_ = false;
  std::string portable_options_;
  std::string program_code_;
  std::string program_format_;
  std::string compile_options_;  // rewritten: portable, or the assignment to replace
  std::shared_ptr<const PrebuiltVariants> prebuilt_;  // set when deserialized

  std::shared_ptr<CompiledVariant> initial_;
  // Compiles for further mappings, least recently used evicted beyond kMaxCachedMappings
  // (the initial one stays). Compiles run outside mu_; executions in flight keep what they use.
  static constexpr size_t kMaxCachedMappings = 16;
  std::mutex mu_;
  // Keyed by the physical devices; looked up by pointer and length (MappingKey) so that a
  // cache hit on the dispatch path allocates nothing.
  struct MappingKey {
    const int* physical;
    size_t n;
  };
  struct MappingLess {
    using is_transparent = void;
    bool operator()(const std::vector<int>& a, const std::vector<int>& b) const { return a < b; }
    bool operator()(const std::vector<int>& a, const MappingKey& b) const {
      return std::lexicographical_compare(a.begin(), a.end(), b.physical, b.physical + b.n);
    }
    bool operator()(const MappingKey& a, const std::vector<int>& b) const {
      return std::lexicographical_compare(a.physical, a.physical + a.n, b.begin(), b.end());
    }
  };
  std::map<std::vector<int>, CacheEntry, MappingLess> by_mapping_;
  std::atomic<uint64_t> use_clock_{0};
  // The single-device variant the latest execution away from the initial one used: the next
  // one placed on that device (the common case: executions stay where their data is) takes
  // it without the map lookup, the future and mu_.
  std::mutex recent_mu_;
  int recent_device_ = -1;
  std::shared_ptr<CompiledVariant> recent_;
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_COMPILE_CACHE_H_
