// A counter bumped on the dispatch path by every thread: each thread adds to one of a few
// cache-line-sized shards, so threads executing at once do not bounce one line between their
// cores; reading sums the shards (rare: stats and metrics).
#ifndef FLEXNPU_BASE_SHARDED_COUNTER_H_
#define FLEXNPU_BASE_SHARDED_COUNTER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace flexnpu {

class ShardedCounter {
 public:
  void Add(int64_t n) { shards_[ThisThreadShard()].value.fetch_add(n, std::memory_order_relaxed); }
  int64_t Load() const {
    int64_t sum = 0;
    for (const Shard& shard : shards_) sum += shard.value.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  static constexpr size_t kShards = 16;
  struct alignas(64) Shard {
    std::atomic<int64_t> value{0};
  };
  // Threads take shards in the order they first count (round robin), so up to kShards
  // threads never share one. The thread's shard + 1, 0 until its first count: a constant
  // initializer, so reading it is one thread-local access without a guard.
  static size_t ThisThreadShard() {
    static std::atomic<size_t> next{0};
    static thread_local size_t shard_plus_one = 0;
    if (shard_plus_one == 0) {
      shard_plus_one = next.fetch_add(1, std::memory_order_relaxed) % kShards + 1;
    }
    return shard_plus_one - 1;
  }
  Shard shards_[kShards];
};

}  // namespace flexnpu

#endif  // FLEXNPU_BASE_SHARDED_COUNTER_H_
