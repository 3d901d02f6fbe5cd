#include "pjrt_flexnpu/runtime/handles.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "pjrt_flexnpu/base/spin_lock.h"

namespace flexnpu::live_handles {
namespace {

// Open addressing with linear probing: inserting a handle allocates nothing unless the shard
// grows, so creating an output buffer stays one allocation.
class Shard {
 public:
  void Insert(uintptr_t key) {
    std::lock_guard<SpinLock> lock(mu_);
    if ((used_ + 1) * 2 > slots_.size()) Rehash();
    size_t i = Index(key);
    size_t tombstone = kNone;
    while (slots_[i] != kEmpty) {
      if (slots_[i] == key) return;
      if (slots_[i] == kErased && tombstone == kNone) tombstone = i;
      i = (i + 1) & (slots_.size() - 1);
    }
    if (tombstone != kNone) {
      slots_[tombstone] = key;
    } else {
      slots_[i] = key;
      ++used_;
    }
  }

  void Erase(uintptr_t key) {
    std::lock_guard<SpinLock> lock(mu_);
    const size_t i = Find(key);
    if (i != kNone) slots_[i] = kErased;
  }

  bool Contains(uintptr_t key) {
    std::lock_guard<SpinLock> lock(mu_);
    return Find(key) != kNone;
  }

 private:
  static constexpr uintptr_t kEmpty = 0;
  static constexpr uintptr_t kErased = 1;  // never a handle: objects are aligned
  static constexpr size_t kNone = ~size_t{0};

  size_t Index(uintptr_t key) const {
    return static_cast<size_t>((key >> 4) * 0x9E3779B97F4A7C15ull >> 20) & (slots_.size() - 1);
  }

  size_t Find(uintptr_t key) const {
    if (slots_.empty()) return kNone;
    for (size_t i = Index(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i] == key) return i;
      if (slots_[i] == kEmpty) return kNone;
    }
  }

  // `used_` counts live and erased slots; rehashing drops the erased ones and sizes the table
  // for the live ones (at most a quarter full), so churn does not grow it.
  void Rehash() {
    std::vector<uintptr_t> old = std::move(slots_);
    size_t live = 1;
    for (uintptr_t key : old) live += key > kErased;
    size_t size = 64;
    while (live * 4 > size) size *= 2;
    slots_.assign(size, kEmpty);
    used_ = 0;
    for (uintptr_t key : old) {
      if (key <= kErased) continue;
      size_t i = Index(key);
      while (slots_[i] != kEmpty) i = (i + 1) & (slots_.size() - 1);
      slots_[i] = key;
      ++used_;
    }
  }

  SpinLock mu_;
  std::vector<uintptr_t> slots_;
  size_t used_ = 0;
};

constexpr size_t kShards = 64;

struct alignas(64) PaddedShard : Shard {};  // shards on their own cache lines

Shard& ShardOf(uintptr_t key) {
  // Never destroyed: handles may be released during static destruction.
  static PaddedShard* shards = new PaddedShard[kShards];
  return shards[(key >> 6) % kShards];
}

}  // namespace

void Insert(const void* object) {
  const auto key = reinterpret_cast<uintptr_t>(object);
  ShardOf(key).Insert(key);
}

// Bumped after every Erase: a thread's cache of handles it found live is valid only while
// this has not moved. Handles in this set (clients, devices, memories, executables; all of
// them in sanitizer builds) are resolved several times per execution and destroyed rarely, so
// the cache answers most lookups without the shard's lock.
std::atomic<uint64_t> erase_epoch{0};

struct LookupCache {
  static constexpr unsigned kEntries = 8;
  uint64_t epoch = ~uint64_t{0};
  uintptr_t keys[kEntries] = {};
  unsigned next = 0;
};

void Erase(const void* object) {
  const auto key = reinterpret_cast<uintptr_t>(object);
  ShardOf(key).Erase(key);
  // After the erase: a thread that learns of the destruction (any happens-before) sees the
  // new epoch in its next lookup, drops its cache and asks the shard.
  erase_epoch.fetch_add(1, std::memory_order_acq_rel);
}

bool Contains(const void* object) {
  const auto key = reinterpret_cast<uintptr_t>(object);
  if (key == 0) return false;  // an empty cache entry is 0
  static thread_local LookupCache cache;
  const uint64_t epoch = erase_epoch.load(std::memory_order_acquire);
  if (cache.epoch == epoch) {
    for (uintptr_t cached : cache.keys) {
      if (cached == key) return true;
    }
  } else {
    cache = LookupCache();
    cache.epoch = epoch;
  }
  if (!ShardOf(key).Contains(key)) return false;
  cache.keys[cache.next++ % LookupCache::kEntries] = key;
  return true;
}

}  // namespace flexnpu::live_handles
