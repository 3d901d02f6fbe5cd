#include "pjrt_flexnpu/hardware/library.h"

#include <dlfcn.h>
#include <link.h>

#include <utility>

namespace flexnpu::hardware {

StatusOr<Library> Library::Open(const std::string& what,
                                const std::vector<std::string>& candidates) {
  std::string tried;
  for (const std::string& candidate : candidates) {
    if (candidate.empty()) continue;
    dlerror();
    void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += (tried.empty() ? "" : "; ") + candidate + ": " + (why ? why : "dlopen failed");
      continue;
    }
    Library library;
    library.handle_ = handle;
    std::string resolved = candidate;
    const link_map* map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
        map->l_name[0] != '\0') {
      resolved = map->l_name;
    }
    library.description_ = what + " at " + resolved;
    return library;
  }
  return NotFound(what + " could not be loaded (tried " + (tried.empty() ? "nothing" : tried) +
                  ")");
}

Library::Library(Library&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      description_(std::move(other.description_)) {}

Library& Library::operator=(Library&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    description_ = std::move(other.description_);
  }
  return *this;
}

Library::~Library() {
  if (handle_ != nullptr) dlclose(handle_);
}

void* Library::Find(const char* symbol) const {
  return handle_ == nullptr ? nullptr : dlsym(handle_, symbol);
}

}  // namespace flexnpu::hardware
