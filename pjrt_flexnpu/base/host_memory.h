// The host's RAM and even shares of a byte count: what the runtime and the daemon report as
// the memory limit of devices that have no memory stats of their own (CPU devices of one host).
#ifndef FLEXNPU_BASE_HOST_MEMORY_H_
#define FLEXNPU_BASE_HOST_MEMORY_H_

#include <unistd.h>

#include <cstdint>

namespace flexnpu {

// The host's RAM; 0 when the system cannot say.
inline int64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<int64_t>(pages) * page_size : 0;
}

// Splits `total` into `parts` shares that add up to it exactly (the first ones get the remainder).
inline int64_t ShareOf(int64_t total, int parts, int index) {
  if (parts <= 0 || total <= 0) return 0;
  return total / parts + (index < total % parts ? 1 : 0);
}

}  // namespace flexnpu

#endif  // FLEXNPU_BASE_HOST_MEMORY_H_
