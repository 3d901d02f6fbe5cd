// Happens-before edges ThreadSanitizer cannot see: the physical backend is not instrumented,
// so when FlexNPU hands a context to it (a callback registration) and gets it back on one of
// its threads, TSan misses the synchronization in between. Release before the hand-off and
// acquire when it comes back; no-ops in other builds.
#ifndef FLEXNPU_BASE_TSAN_H_
#define FLEXNPU_BASE_TSAN_H_

#if defined(__SANITIZE_THREAD__)
#define FLEXNPU_TSAN_ENABLED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FLEXNPU_TSAN_ENABLED 1
#endif
#endif

#ifdef FLEXNPU_TSAN_ENABLED
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#define FLEXNPU_TSAN_RELEASE(addr) __tsan_release(static_cast<void*>(addr))
#define FLEXNPU_TSAN_ACQUIRE(addr) __tsan_acquire(static_cast<void*>(addr))
#else
#define FLEXNPU_TSAN_RELEASE(addr) ((void)(addr))
#define FLEXNPU_TSAN_ACQUIRE(addr) ((void)(addr))
#endif

#endif  // FLEXNPU_BASE_TSAN_H_
