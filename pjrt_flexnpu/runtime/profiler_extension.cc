#include "pjrt_flexnpu/runtime/profiler_extension.h"

#include <cstddef>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "pjrt_flexnpu/backend/modelled_time.h"

namespace flexnpu {
namespace {
// Far above any profiler extension struct (a base and a few pointers); a larger size is
// taken as a corrupt chain rather than copied.
constexpr size_t kMaxExtensionSize = 4096;
// A cycle in a corrupt chain must not hang the plugin's load.
constexpr int kMaxChainLength = 64;

// Copies stay reachable (and are never freed): JAX may hold the extension until exit.
void Keep(void* copy) {
  static std::mutex mu;
  static auto* copies = new std::vector<void*>();
  std::lock_guard<std::mutex> lock(mu);
  copies->push_back(copy);
}
}  // namespace

PJRT_Extension_Base* ForwardedProfilerExtension(const PJRT_Api& inner) {
  if (inner.struct_size < offsetof(PJRT_Api, extension_start) + sizeof(inner.extension_start)) {
    return nullptr;
  }
  const PJRT_Extension_Base* e = inner.extension_start;
  for (int i = 0; e != nullptr && i < kMaxChainLength; ++i, e = e->next) {
    if (ExtensionTypeOf(*e) != static_cast<uint32_t>(PJRT_Extension_Type_Profiler)) continue;
    if (e->struct_size < sizeof(PJRT_Extension_Base) || e->struct_size > kMaxExtensionSize) {
      return nullptr;
    }
    void* copy = ::operator new(e->struct_size, std::nothrow);
    if (copy == nullptr) return nullptr;
    Keep(copy);
    std::memcpy(copy, e, e->struct_size);
    auto* base = static_cast<PJRT_Extension_Base*>(copy);
    base->next = nullptr;
    return base;
  }
  return nullptr;
}

}  // namespace flexnpu
