// The compiled variants of one virtual executable's program. A program over N virtual devices
// is compiled for a mapping onto N distinct physical devices (the device assignment rewritten
// to physical ids), once per mapping the placer uses, cached. Single-device programs can
// instead be compiled once, portable, and run on whichever physical device the placer picks
// (option single_device_compile=portable).
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
  // When an execution last used it (the cache's use clock): set on the fast path too, which
  // skips the map, so eviction sees real use.
  std::atomic<uint64_t> last_use{0};
};

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
