// Every handle FlexNPU gives JAX is registered while it lives and starts with a tag: a pointer
// that is not FlexNPU's, or an object already destroyed, is reported as an error without being
// read (only live handles are dereferenced), and a live handle of another type by its tag.
#ifndef FLEXNPU_RUNTIME_HANDLES_H_
#define FLEXNPU_RUNTIME_HANDLES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "pjrt_flexnpu/runtime/handle_pool.h"

namespace flexnpu {

// The set of live handle addresses (sharded, allocation-free on the common path).
namespace live_handles {
void Insert(const void* object);
void Erase(const void* object);
bool Contains(const void* object);
}  // namespace live_handles

enum class Tag : uint32_t {
  kDead = 0xDEADF1E0,
  kClient = 0xF1E00001,
  kDevice = 0xF1E00002,
  kDeviceDescription = 0xF1E00003,
  kMemory = 0xF1E00004,
  kTopology = 0xF1E00005,
  kBuffer = 0xF1E00006,
  kEvent = 0xF1E00007,
  kExecutable = 0xF1E00008,
  kLoadedExecutable = 0xF1E00009,
  kExecuteContext = 0xF1E0000A,
};

// The first base of every handle class (none of them has virtual functions, so the tag sits
// at offset 0).
class Tagged {
 public:
  // Pooled types (FLEXNPU_POOLED_HANDLE) live in handle_pool and are recognised by address.
  static constexpr bool kPooled = false;
  explicit Tagged(Tag tag, bool pooled = false)
      : tag_(tag), registered_(!(pooled && handle_pool::kEnabled)) {
    if (registered_) live_handles::Insert(this);
  }
  ~Tagged() {
    if (registered_) live_handles::Erase(this);
    tag_ = Tag::kDead;
  }
  Tagged(const Tagged&) = delete;
  Tagged& operator=(const Tagged&) = delete;
  Tag tag() const { return tag_; }

 private:
  friend struct TaggedLayout;
  volatile Tag tag_;
  const bool registered_;
  // Never read or written by the object: while its slot of handle_pool is free, the pool keeps
  // the number of the next free slot here, and a pop racing with the slot's reuse reads it
  // (handle_pool.cc). Reserving it means constructing a pooled handle never writes the bytes
  // such a racing pop reads (ThreadSanitizer reported exactly that, with the pool forced on).
  [[maybe_unused]] uint64_t pool_link_;
};
struct TaggedLayout {
  static_assert(offsetof(Tagged, pool_link_) == handle_pool::kLinkOffset,
                "the pool's link word must lie where no handle writes");
};

// In a handle class created and resolved on every execution: its objects live in handle_pool
// (pass `kPooled` to the Tagged constructor).
#define FLEXNPU_POOLED_HANDLE                                                       \
  static constexpr bool kPooled = true;                                             \
  static void* operator new(size_t size) {                                          \
    return ::flexnpu::handle_pool::kEnabled ? ::flexnpu::handle_pool::Allocate(size) \
                                            : ::operator new(size);                  \
  }                                                                                 \
  static void operator delete(void* p, size_t size) {                               \
    if (::flexnpu::handle_pool::kEnabled) {                                         \
      ::flexnpu::handle_pool::Free(p, size);                                        \
    } else {                                                                        \
      ::operator delete(p);                                                         \
    }                                                                               \
  }

// Returns `handle` as a T when it is a live FlexNPU object carrying T's tag, else nullptr.
template <typename T, typename Handle>
T* FromHandle(Handle* handle) {
  if (handle == nullptr) return nullptr;
  if constexpr (T::kPooled && handle_pool::kEnabled) {
    // A slot of the pool, live or not: its first bytes are FlexNPU's memory either way.
    if (!handle_pool::Owns(handle)) return nullptr;
    Tag tag;
    std::memcpy(&tag, static_cast<const void*>(handle), sizeof(tag));
    if (tag != T::kTag) return nullptr;
    return static_cast<T*>(reinterpret_cast<Tagged*>(handle));
  } else {
    if (!live_handles::Contains(handle)) return nullptr;
    auto* tagged = reinterpret_cast<Tagged*>(handle);
    return tagged->tag() == T::kTag ? static_cast<T*>(tagged) : nullptr;
  }
}

template <typename Handle, typename T>
Handle* ToHandle(T* object) {
  return reinterpret_cast<Handle*>(static_cast<Tagged*>(object));
}

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_HANDLES_H_
