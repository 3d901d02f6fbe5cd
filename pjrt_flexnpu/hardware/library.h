// A vendor library opened with dlopen (internal to the hardware layer).
#ifndef FLEXNPU_HARDWARE_LIBRARY_H_
#define FLEXNPU_HARDWARE_LIBRARY_H_

#include <string>
#include <vector>

#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::hardware {

class Library {
 public:
  // Tries `candidates` in order (paths or bare names for the loader). NotFound naming what
  // was tried and dlerror's text for each.
  static StatusOr<Library> Open(const std::string& what, const std::vector<std::string>& candidates);
  Library() = default;
  Library(Library&& other) noexcept;
  Library& operator=(Library&& other) noexcept;
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  ~Library();

  // The symbol, or nullptr.
  void* Find(const char* symbol) const;
  template <typename F>
  bool Bind(const char* symbol, F** out) const {
    *out = reinterpret_cast<F*>(Find(symbol));
    return *out != nullptr;
  }
  // Binds a required symbol; a missing one is added to `*missing` ("a, b"), so a loader binds
  // them all and reports every absent one in one error.
  template <typename F>
  void Require(const char* symbol, F** out, std::string* missing) const {
    if (!Bind(symbol, out)) *missing += (missing->empty() ? "" : ", ") + std::string(symbol);
  }
  // "libascendcl.so at /opt/.../libascendcl.so"
  const std::string& description() const { return description_; }
  bool loaded() const { return handle_ != nullptr; }

 private:
  void* handle_ = nullptr;
  std::string description_;
};

}  // namespace flexnpu::hardware

#endif  // FLEXNPU_HARDWARE_LIBRARY_H_
