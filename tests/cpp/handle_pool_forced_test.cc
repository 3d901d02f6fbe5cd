// The handle pool with FLEXNPU_FORCE_POOL: built from the pool's own sources (not the runtime
// library) so that the pool is on in every build, sanitizer builds included, and the
// ThreadSanitizer job checks its lock-free free stacks (issue 13: the pool was compiled out of
// the TSan build). Handles and records are made on one thread and resolved and destroyed on
// another (as JAX creates buffers on its dispatch thread and frees them elsewhere), while every
// thread also churns its own; afterwards every destroyed handle must be rejected.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "pjrt_flexnpu/runtime/handle_pool.h"
#include "pjrt_flexnpu/runtime/handles.h"

#ifndef FLEXNPU_FORCE_POOL
#error "build this test with FLEXNPU_FORCE_POOL (tests/cpp/CMakeLists.txt, tests/cpp/BUILD)"
#endif

namespace flexnpu {
namespace {

static_assert(handle_pool::kEnabled, "FLEXNPU_FORCE_POOL must turn the pool on");

struct TestHandle;  // opaque, as PJRT_Buffer is to JAX

class PooledObject : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kBuffer;
  FLEXNPU_POOLED_HANDLE
  explicit PooledObject(uint64_t id) : Tagged(kTag, kPooled), id_(id), check_(~id) {}
  ~PooledObject() { id_ = check_ = 0; }
  uint64_t id() const { return id_; }
  bool intact() const { return check_ == ~id_; }

 private:
  uint64_t id_;
  uint64_t check_;
  char payload_[40] = {};  // a second size class next to the records below
};

struct Record {
  uint64_t id;
  uint64_t check;
};

TestHandle* ToTest(PooledObject* object) { return ToHandle<TestHandle>(object); }

TEST(HandlePoolForcedTest, ResolvesLiveHandlesAndRejectsDestroyedAndForeignOnes) {
  auto* object = new PooledObject(7);
  TestHandle* handle = ToTest(object);
  ASSERT_TRUE(handle_pool::Owns(object));
  ASSERT_EQ(FromHandle<PooledObject>(handle), object);
  EXPECT_EQ(FromHandle<PooledObject>(handle)->id(), 7u);
  // Inside a slot but not its start, and memory that is not the pool's.
  EXPECT_EQ(FromHandle<PooledObject>(
                reinterpret_cast<TestHandle*>(reinterpret_cast<char*>(object) + 8)),
            nullptr);
  uint64_t on_stack[8] = {};
  std::memcpy(on_stack, object, sizeof(Tag));  // even with the right tag
  EXPECT_EQ(FromHandle<PooledObject>(reinterpret_cast<TestHandle*>(on_stack)), nullptr);
  delete object;
  EXPECT_EQ(FromHandle<PooledObject>(handle), nullptr) << "a destroyed handle resolved";
  // A record made in the freed slot does not make the stale handle resolve either.
  auto* record = handle_pool::New<Record>(Record{1, 2});
  EXPECT_EQ(FromHandle<PooledObject>(handle), nullptr);
  handle_pool::Delete(record);
}

TEST(HandlePoolForcedTest, ConcurrentCreateResolveDestroyAcrossThreads) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 20000;
  std::mutex mu;
  std::deque<TestHandle*> handed;  // made by one thread, resolved and destroyed by another
  std::atomic<int> wrong{0};
  std::atomic<uint64_t> next_id{1};
  std::mutex stale_mu;
  std::vector<TestHandle*> stale;
  auto worker = [&](int t) {
    std::vector<TestHandle*> mine;
    std::vector<TestHandle*> destroyed;
    for (int i = 0; i < kRounds; ++i) {
      const uint64_t id = next_id.fetch_add(1, std::memory_order_relaxed);
      auto* object = new PooledObject(id);
      auto* record = handle_pool::New<Record>(Record{id, ~id});
      if (FromHandle<PooledObject>(ToTest(object)) != object || !object->intact() ||
          record->check != ~record->id) {
        wrong.fetch_add(1);
      }
      handle_pool::Delete(record);
      if (i % 2 == 0) {
        std::lock_guard<std::mutex> lock(mu);
        handed.push_back(ToTest(object));
      } else {
        mine.push_back(ToTest(object));
      }
      // Resolve and destroy one handed over by any thread (usually another one).
      TestHandle* theirs = nullptr;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!handed.empty() && (i + t) % 3 != 0) {
          theirs = handed.front();
          handed.pop_front();
        }
      }
      if (theirs != nullptr) {
        PooledObject* resolved = FromHandle<PooledObject>(theirs);
        if (resolved == nullptr || !resolved->intact()) wrong.fetch_add(1);
        delete resolved;
        destroyed.push_back(theirs);
      }
      if (mine.size() > 64) {
        for (TestHandle* h : mine) {
          PooledObject* resolved = FromHandle<PooledObject>(h);
          if (resolved == nullptr || !resolved->intact()) wrong.fetch_add(1);
          delete resolved;
          destroyed.push_back(h);
        }
        mine.clear();
      }
    }
    for (TestHandle* h : mine) {
      delete FromHandle<PooledObject>(h);
      destroyed.push_back(h);
    }
    std::lock_guard<std::mutex> lock(stale_mu);
    stale.insert(stale.end(), destroyed.begin(), destroyed.end());
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& thread : threads) thread.join();
  for (TestHandle* h : handed) {
    delete FromHandle<PooledObject>(h);
    stale.push_back(h);
  }
  EXPECT_EQ(wrong.load(), 0) << "live handles that did not resolve to an intact object";
  EXPECT_EQ(stale.size(), static_cast<size_t>(kThreads) * kRounds);
  // Every object is destroyed now: no stale handle may resolve, whichever slots were reused.
  size_t resolved = 0;
  for (TestHandle* h : stale) resolved += FromHandle<PooledObject>(h) != nullptr;
  EXPECT_EQ(resolved, 0u);
  // Slots were reused (the pool recycles instead of growing without bound).
  std::set<TestHandle*> distinct(stale.begin(), stale.end());
  EXPECT_LT(distinct.size(), stale.size());
}

}  // namespace
}  // namespace flexnpu
