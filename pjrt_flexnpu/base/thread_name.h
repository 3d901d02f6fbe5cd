// Names the threads FlexNPU starts, as top -H, gdb, perf and py-spy show them.
#ifndef FLEXNPU_BASE_THREAD_NAME_H_
#define FLEXNPU_BASE_THREAD_NAME_H_

#include <pthread.h>

#include <cstring>

namespace flexnpu {

// Linux keeps 15 characters of a thread's name (and refuses longer ones), so `name` is cut there.
inline void NameThisThread(const char* name) {
  constexpr size_t kMaxLength = 15;
  char cut[kMaxLength + 1] = {};
  std::strncpy(cut, name, kMaxLength);
#if defined(__APPLE__)
  pthread_setname_np(cut);
#else
  pthread_setname_np(pthread_self(), cut);
#endif
}

}  // namespace flexnpu

#endif  // FLEXNPU_BASE_THREAD_NAME_H_
