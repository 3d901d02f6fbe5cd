// Every handle FlexNPU gives JAX starts with a tag, so a pointer that is not FlexNPU's (or
// an object already destroyed) is reported as an error instead of being dereferenced as one.
#ifndef FLEXNPU_RUNTIME_HANDLES_H_
#define FLEXNPU_RUNTIME_HANDLES_H_

#include <cstdint>

namespace flexnpu {

enum class Tag : uint32_t {
  kDead = 0xDEADF1E0,
  kClient = 0xF1E00001,
  kDevice = 0xF1E00002,
  kDeviceDescription = 0xF1E00003,
  kMemory = 0xF1E00004,
  kTopology = 0xF1E00005,
  kBuffer = 0xF1E00006,
  kEvent = 0xF1E00007,
  kExecutable = 0xF1E00008,
  kLoadedExecutable = 0xF1E00009,
};

// The first base of every handle class (none of them has virtual functions, so the tag sits
// at offset 0).
class Tagged {
 public:
  explicit Tagged(Tag tag) : tag_(tag) {}
  ~Tagged() { tag_ = Tag::kDead; }
  Tagged(const Tagged&) = delete;
  Tagged& operator=(const Tagged&) = delete;
  Tag tag() const { return tag_; }

 private:
  volatile Tag tag_;
};

// Returns `handle` as a T when it carries T's tag, else nullptr.
template <typename T, typename Handle>
T* FromHandle(Handle* handle) {
  if (handle == nullptr) return nullptr;
  auto* tagged = reinterpret_cast<Tagged*>(handle);
  return tagged->tag() == T::kTag ? static_cast<T*>(tagged) : nullptr;
}

template <typename Handle, typename T>
Handle* ToHandle(T* object) {
  return reinterpret_cast<Handle*>(static_cast<Tagged*>(object));
}

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_HANDLES_H_
