// Storage for the handles JAX creates and resolves on every execution (buffers, events) and the
// small per-execution records behind them: one reserved address range that is never returned,
// cut into fixed-size slots. Telling whether a pointer is one of its slots is a range check and a
// multiplication, no lock and no write, and a destroyed object's slot keeps its dead tag until
// reused, so resolving a stale handle reads FlexNPU's own memory, never freed memory. Free slots
// sit on one lock-free stack per size class (no global lock on the dispatch path). Sanitizer
// builds allocate normally instead (ASan must see every object's lifetime): there the live-handle
// set answers for all handles (unless FLEXNPU_FORCE_POOL, below).
#ifndef FLEXNPU_RUNTIME_HANDLE_POOL_H_
#define FLEXNPU_RUNTIME_HANDLE_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace flexnpu::handle_pool {

// FLEXNPU_FORCE_POOL (defined for every translation unit of a binary, never for some): the pool
// even in sanitizer builds, so that ThreadSanitizer checks its lock-free stacks
// (tests/cpp/handle_pool_forced_test.cc builds the pool's sources so).
#if defined(FLEXNPU_FORCE_POOL)
inline constexpr bool kEnabled = true;
#elif defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kEnabled = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kEnabled = false;
#else
inline constexpr bool kEnabled = true;
#endif
#else
inline constexpr bool kEnabled = true;
#endif

inline constexpr size_t kSlotAlign = 64;
// Where a free slot holds the number of the next free slot: a word that neither handles
// (Tagged reserves it) nor records (their header) ever write, since a pop may read it while the
// thread that popped the slot first constructs its new object.
inline constexpr size_t kLinkOffset = 8;
inline constexpr size_t kChunkBytes = size_t{1} << 20;
inline constexpr size_t kMaxChunks = 16384;  // 16 GiB of address space, committed a chunk at a time
inline constexpr size_t kMaxClasses = 64;    // slots up to 4 KiB

// What Owns reads: the range and the size class of each committed chunk (0: none yet).
struct Range {
  std::atomic<char*> base{nullptr};
  std::atomic<size_t> committed{0};                 // chunks usable
  std::atomic<uint16_t> chunk_class[kMaxChunks]{};  // slot size / 64 of each chunk
};
extern Range range;

// Slot index within a chunk by multiplication instead of a division (a 64-bit division costs
// tens of cycles, and every handle JAX passes is resolved here): with d = slot bytes <= 4 KiB and
// offsets below 1 MiB, n * d < 2^32, so floor(n * (floor(2^32 / d) + 1) / 2^32) == n / d.
struct Reciprocals {
  uint64_t of_class[kMaxClasses] = {};
  uint32_t slots_per_chunk[kMaxClasses] = {};
  constexpr Reciprocals() {
    for (size_t cls = 1; cls < kMaxClasses; ++cls) {
      of_class[cls] = (uint64_t{1} << 32) / (cls * kSlotAlign) + 1;
      slots_per_chunk[cls] = static_cast<uint32_t>(kChunkBytes / (cls * kSlotAlign));
    }
  }
};
inline constexpr Reciprocals kReciprocals;
static_assert(kChunkBytes * kMaxClasses * kSlotAlign <= (uint64_t{1} << 32));

// A slot of at least `size` bytes (64-byte aligned); throws std::bad_alloc when exhausted.
void* Allocate(size_t size);
// Returns the slot of an object of `size` bytes; its first 8 bytes are left as they are.
void Free(void* slot, size_t size);

// True when `p` is the start of a slot of the pool (live or free). Inline: every handle JAX
// passes for a buffer or an event is resolved here.
inline bool Owns(const void* p) {
  char* base = range.base.load(std::memory_order_relaxed);
  const auto address = reinterpret_cast<uintptr_t>(p);
  const auto start = reinterpret_cast<uintptr_t>(base);
  if (base == nullptr || address < start) return false;
  const size_t offset = address - start;
  const size_t chunks = range.committed.load(std::memory_order_acquire);
  if (offset >= chunks * kChunkBytes) return false;
  const size_t cls = range.chunk_class[offset / kChunkBytes].load(std::memory_order_relaxed);
  if (cls == 0) return false;
  const size_t in_chunk = offset & (kChunkBytes - 1);
  const size_t index = (in_chunk * kReciprocals.of_class[cls]) >> 32;
  return index * (cls * kSlotAlign) == in_chunk && index < kReciprocals.slots_per_chunk[cls];
}

// A T in a slot of the pool (plain new/delete in sanitizer builds): for the records made per
// execution (callback contexts) that would otherwise cost a malloc and a free each. The slot
// starts with a word no handle tag equals, then the link word (kLinkOffset), and the record
// follows them, so a stale handle whose slot now holds a record is still rejected by its tag.
inline constexpr size_t kRecordHeader = 16;
static_assert(kLinkOffset + 8 <= kRecordHeader);

template <typename T, typename... Args>
T* New(Args&&... args) {
  static_assert(alignof(T) <= kRecordHeader, "record over-aligned for the pool");
  if constexpr (!kEnabled) {
    return new T(std::forward<Args>(args)...);
  } else {
    char* slot = static_cast<char*>(Allocate(kRecordHeader + sizeof(T)));
    *reinterpret_cast<uint64_t*>(slot) = 0;
    try {
      return new (slot + kRecordHeader) T(std::forward<Args>(args)...);
    } catch (...) {
      Free(slot, kRecordHeader + sizeof(T));
      throw;
    }
  }
}
template <typename T>
void Delete(T* object) {
  if (object == nullptr) return;
  if constexpr (!kEnabled) {
    delete object;
  } else {
    object->~T();
    Free(reinterpret_cast<char*>(object) - kRecordHeader, kRecordHeader + sizeof(T));
  }
}
// An allocator over the pool with the same header, for std::allocate_shared (one pooled block
// for an object and its reference counts instead of a malloc).
template <typename T>
struct Allocator {
  using value_type = T;
  Allocator() = default;
  template <typename U>
  Allocator(const Allocator<U>&) {}  // NOLINT(google-explicit-constructor): rebinding
  T* allocate(size_t n) {
    static_assert(alignof(T) <= kRecordHeader, "record over-aligned for the pool");
    if constexpr (!kEnabled) {
      return static_cast<T*>(::operator new(n * sizeof(T)));
    } else {
      char* slot = static_cast<char*>(Allocate(kRecordHeader + n * sizeof(T)));
      *reinterpret_cast<uint64_t*>(slot) = 0;
      return reinterpret_cast<T*>(slot + kRecordHeader);
    }
  }
  void deallocate(T* p, size_t n) {
    if constexpr (!kEnabled) {
      ::operator delete(p);
    } else {
      Free(reinterpret_cast<char*>(p) - kRecordHeader, kRecordHeader + n * sizeof(T));
    }
  }
  template <typename U>
  bool operator==(const Allocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const Allocator<U>&) const { return false; }
};

// A unique_ptr deleter for objects made by New.
struct Deleter {
  template <typename T>
  void operator()(T* object) const {
    Delete(object);
  }
};

}  // namespace flexnpu::handle_pool

#endif  // FLEXNPU_RUNTIME_HANDLE_POOL_H_
