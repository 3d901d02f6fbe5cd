// Storage for the handles JAX creates and resolves on every execution (buffers, events): one
// reserved address range that is never returned, cut into fixed-size slots. Telling whether a
// pointer is one of its slots is a range check and a division, no lock and no write, and a
// destroyed object's slot keeps its dead tag until reused, so resolving a stale handle reads
// FlexNPU's own memory, never freed memory. Sanitizer builds allocate normally instead (ASan
// must see every object's lifetime): there the live-handle set answers for all handles.
#ifndef FLEXNPU_RUNTIME_HANDLE_POOL_H_
#define FLEXNPU_RUNTIME_HANDLE_POOL_H_

#include <cstddef>

namespace flexnpu::handle_pool {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
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

// A slot of at least `size` bytes (64-byte aligned); throws std::bad_alloc when exhausted.
void* Allocate(size_t size);
// Returns the slot of an object of `size` bytes; its first 8 bytes are left as they are.
void Free(void* slot, size_t size);
// True when `p` is the start of a slot of the pool (live or free).
bool Owns(const void* p);

}  // namespace flexnpu::handle_pool

#endif  // FLEXNPU_RUNTIME_HANDLE_POOL_H_
