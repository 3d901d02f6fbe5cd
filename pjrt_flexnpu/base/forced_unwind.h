// FLEXNPU_RETHROWS_FORCED_UNWIND: for functions that catch abi::__forced_unwind& to rethrow it.
#ifndef FLEXNPU_BASE_FORCED_UNWIND_H_
#define FLEXNPU_BASE_FORCED_UNWIND_H_

// On a function that catches abi::__forced_unwind& to rethrow it: the forced unwind is a
// foreign exception, so that reference binds to no object, and UBSan's null check (in the
// sanitizer build) reports the binding itself as an error. In sanitizer builds such a
// function is also never inlined: inlined into a caller without the exemption, its catch is
// checked after all (seen with Guard inlined into PJRT_Event_OnReady).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FLEXNPU_RETHROWS_FORCED_UNWIND __attribute__((no_sanitize("null"), noinline))
#else
#define FLEXNPU_RETHROWS_FORCED_UNWIND __attribute__((no_sanitize("null")))
#endif

#endif  // FLEXNPU_BASE_FORCED_UNWIND_H_
