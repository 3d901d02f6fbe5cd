#include "pjrt_flexnpu/runtime/handle_pool.h"

#include <sys/mman.h>

#include <mutex>

namespace flexnpu::handle_pool {

// Constant-initialized, never destroyed in any way that matters (all members are trivially
// destructible): handles may be released during static destruction.
Range range;

namespace {

// Free slots of one size class: a Treiber stack whose head packs the top slot's number (offset /
// 64, plus one; 0 when empty) with a counter bumped by every push and pop, so a pop that raced
// with a pop and a push of the same slot (ABA) fails its compare-exchange instead of linking a
// slot that is in use. 16 GiB / 64 B = 2^28 slots, numbered from 1; the other 35 bits count.
constexpr int kSlotBits = 29;
constexpr uint64_t kSlotMask = (uint64_t{1} << kSlotBits) - 1;
static_assert(kChunkBytes * kMaxChunks / kSlotAlign <= kSlotMask);

struct alignas(64) FreeStack {
  std::atomic<uint64_t> head{0};
};

struct Pool {
  FreeStack free[kMaxClasses];
  std::mutex grow_mu;  // bump allocation and new chunks (a free stack ran empty)
  char* bump[kMaxClasses] = {};
  char* bump_end[kMaxClasses] = {};
};
Pool pool;

char* Base() {
  char* base = range.base.load(std::memory_order_acquire);
  if (base != nullptr) return base;
  static char* reserved = [] {
    void* mapped = mmap(nullptr, kChunkBytes * kMaxChunks, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    char* start = mapped == MAP_FAILED ? nullptr : static_cast<char*>(mapped);
    range.base.store(start, std::memory_order_release);
    return start;
  }();
  return reserved;
}

// Where a free slot keeps the number of the next free slot: after the tag, which stays
// readable, in the word no object writes (kLinkOffset). Read and written atomically: a pop may
// read a slot that another thread has just popped and is constructing an object in; the value
// it reads then is discarded (its compare-exchange fails), the memory is the pool's either way
// (never unmapped), and the constructor does not write that word, so the two do not race.
uint64_t* NextOf(void* slot) {
  return reinterpret_cast<uint64_t*>(static_cast<char*>(slot) + kLinkOffset);
}

uint64_t NumberOf(const char* base, const void* slot) {
  return static_cast<uint64_t>(static_cast<const char*>(slot) - base) / kSlotAlign + 1;
}

}  // namespace

void* Allocate(size_t size) {
  const size_t cls = (size + kSlotAlign - 1) / kSlotAlign;
  char* base = Base();
  if (base == nullptr || cls == 0 || cls >= kMaxClasses) throw std::bad_alloc();
  std::atomic<uint64_t>& head = pool.free[cls].head;
  uint64_t top = head.load(std::memory_order_acquire);
  while ((top & kSlotMask) != 0) {
    char* slot = base + ((top & kSlotMask) - 1) * kSlotAlign;
    const uint64_t next = __atomic_load_n(NextOf(slot), __ATOMIC_RELAXED);
    const uint64_t popped = (((top >> kSlotBits) + 1) << kSlotBits) | (next & kSlotMask);
    if (head.compare_exchange_weak(top, popped, std::memory_order_acquire,
                                   std::memory_order_acquire)) {
      return slot;
    }
  }
  std::lock_guard<std::mutex> lock(pool.grow_mu);
  const size_t slot_bytes = cls * kSlotAlign;
  if (pool.bump[cls] == nullptr || pool.bump[cls] + slot_bytes > pool.bump_end[cls]) {
    const size_t chunk = range.committed.load(std::memory_order_relaxed);
    if (chunk >= kMaxChunks) throw std::bad_alloc();
    char* start = base + chunk * kChunkBytes;
    if (mprotect(start, kChunkBytes, PROT_READ | PROT_WRITE) != 0) throw std::bad_alloc();
    range.chunk_class[chunk].store(static_cast<uint16_t>(cls), std::memory_order_relaxed);
    range.committed.store(chunk + 1, std::memory_order_release);  // publishes the class too
    pool.bump[cls] = start;
    pool.bump_end[cls] = start + (kChunkBytes / slot_bytes) * slot_bytes;
  }
  void* slot = pool.bump[cls];
  pool.bump[cls] += slot_bytes;
  return slot;
}

void Free(void* slot, size_t size) {
  const size_t cls = (size + kSlotAlign - 1) / kSlotAlign;
  char* base = range.base.load(std::memory_order_relaxed);  // set: the slot came from it
  const uint64_t number = NumberOf(base, slot);
  std::atomic<uint64_t>& head = pool.free[cls].head;
  uint64_t top = head.load(std::memory_order_relaxed);
  uint64_t pushed;
  do {
    __atomic_store_n(NextOf(slot), top & kSlotMask, __ATOMIC_RELAXED);
    pushed = (((top >> kSlotBits) + 1) << kSlotBits) | number;
  } while (!head.compare_exchange_weak(top, pushed, std::memory_order_release,
                                       std::memory_order_relaxed));
}

}  // namespace flexnpu::handle_pool
