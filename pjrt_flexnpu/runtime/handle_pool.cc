#include "pjrt_flexnpu/runtime/handle_pool.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>

namespace flexnpu::handle_pool {
namespace {

constexpr size_t kSlotAlign = 64;
constexpr size_t kChunkBytes = size_t{1} << 20;
constexpr size_t kMaxChunks = 16384;  // 16 GiB of address space, committed a chunk at a time
constexpr size_t kMaxClasses = 64;    // slots up to 4 KiB

struct Pool {
  char* base = nullptr;
  std::atomic<size_t> committed{0};                 // chunks usable
  std::atomic<uint16_t> chunk_class[kMaxChunks]{};  // slot size / 64 of each chunk
  std::mutex mu;                                    // allocation, free lists, new chunks
  void* free_list[kMaxClasses] = {};
  char* bump[kMaxClasses] = {};
  char* bump_end[kMaxClasses] = {};
};

Pool* TheP() {
  // Never destroyed: handles may be released during static destruction.
  static Pool* pool = [] {
    auto* p = new Pool();
    void* range = mmap(nullptr, kChunkBytes * kMaxChunks, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    p->base = range == MAP_FAILED ? nullptr : static_cast<char*>(range);
    return p;
  }();
  return pool;
}

// Slot index within a chunk by multiplication instead of a division (a 64-bit division costs
// tens of cycles, and every handle JAX passes is resolved here): with d = slot bytes <= 4 KiB and
// offsets below 1 MiB, n * d < 2^32, so floor(n * (floor(2^32 / d) + 1) / 2^32) == n / d.
struct Reciprocals {
  uint64_t of_class[kMaxClasses] = {};
  size_t slots_per_chunk[kMaxClasses] = {};
  constexpr Reciprocals() {
    for (size_t cls = 1; cls < kMaxClasses; ++cls) {
      of_class[cls] = (uint64_t{1} << 32) / (cls * kSlotAlign) + 1;
      slots_per_chunk[cls] = kChunkBytes / (cls * kSlotAlign);
    }
  }
};
constexpr Reciprocals kReciprocals;
static_assert(kChunkBytes * kMaxClasses * kSlotAlign <= (uint64_t{1} << 32));

// Where a free slot keeps the next free slot: after the tag, which stays readable.
void*& NextOf(void* slot) { return *reinterpret_cast<void**>(static_cast<char*>(slot) + 8); }

}  // namespace

void* Allocate(size_t size) {
  const size_t cls = (size + kSlotAlign - 1) / kSlotAlign;
  Pool* pool = TheP();
  if (pool->base == nullptr || cls == 0 || cls >= kMaxClasses) throw std::bad_alloc();
  std::lock_guard<std::mutex> lock(pool->mu);
  if (void* slot = pool->free_list[cls]) {
    pool->free_list[cls] = NextOf(slot);
    return slot;
  }
  const size_t slot_bytes = cls * kSlotAlign;
  if (pool->bump[cls] == nullptr || pool->bump[cls] + slot_bytes > pool->bump_end[cls]) {
    const size_t chunk = pool->committed.load(std::memory_order_relaxed);
    if (chunk >= kMaxChunks) throw std::bad_alloc();
    char* start = pool->base + chunk * kChunkBytes;
    if (mprotect(start, kChunkBytes, PROT_READ | PROT_WRITE) != 0) throw std::bad_alloc();
    pool->chunk_class[chunk].store(static_cast<uint16_t>(cls), std::memory_order_relaxed);
    pool->committed.store(chunk + 1, std::memory_order_release);  // publishes the class too
    pool->bump[cls] = start;
    pool->bump_end[cls] = start + (kChunkBytes / slot_bytes) * slot_bytes;
  }
  void* slot = pool->bump[cls];
  pool->bump[cls] += slot_bytes;
  return slot;
}

void Free(void* slot, size_t size) {
  const size_t cls = (size + kSlotAlign - 1) / kSlotAlign;
  Pool* pool = TheP();
  std::lock_guard<std::mutex> lock(pool->mu);
  NextOf(slot) = pool->free_list[cls];
  pool->free_list[cls] = slot;
}

bool Owns(const void* p) {
  Pool* pool = TheP();
  const auto address = reinterpret_cast<uintptr_t>(p);
  const auto base = reinterpret_cast<uintptr_t>(pool->base);
  if (pool->base == nullptr || address < base) return false;
  const size_t offset = address - base;
  const size_t chunks = pool->committed.load(std::memory_order_acquire);
  if (offset >= chunks * kChunkBytes) return false;
  const size_t cls = pool->chunk_class[offset / kChunkBytes].load(std::memory_order_relaxed);
  if (cls == 0) return false;
  const size_t slot_bytes = cls * kSlotAlign;
  const size_t in_chunk = offset & (kChunkBytes - 1);
  const size_t index = (in_chunk * kReciprocals.of_class[cls]) >> 32;
  return index * slot_bytes == in_chunk && index < kReciprocals.slots_per_chunk[cls];
}

}  // namespace flexnpu::handle_pool
