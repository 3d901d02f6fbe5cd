// Every handle FlexNPU gives JAX is registered while it lives and starts with a tag: a pointer
// that is not FlexNPU's, or an object already destroyed, is reported as an error without being
// read (only live handles are dereferenced), and a live handle of another type by its tag.
#ifndef FLEXNPU_RUNTIME_HANDLES_H_
#define FLEXNPU_RUNTIME_HANDLES_H_

#include <cstdint>

namespace flexnpu {

// The set of live handle addresses (sharded, allocation-free on the common path).
namespace live_handles {
void Insert(const void* object);
void Erase(const void* object);
bool Contains(const void* object);
}  // namespace live_handles

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
  explicit Tagged(Tag tag) : tag_(tag) { live_handles::Insert(this); }
  ~Tagged() {
    live_handles::Erase(this);
    tag_ = Tag::kDead;
  }
  Tagged(const Tagged&) = delete;
  Tagged& operator=(const Tagged&) = delete;
  Tag tag() const { return tag_; }

 private:
  volatile Tag tag_;
};

// Returns `handle` as a T when it is a live FlexNPU object carrying T's tag, else nullptr.
template <typename T, typename Handle>
T* FromHandle(Handle* handle) {
  if (handle == nullptr || !live_handles::Contains(handle)) return nullptr;
  auto* tagged = reinterpret_cast<Tagged*>(handle);
  return tagged->tag() == T::kTag ? static_cast<T*>(tagged) : nullptr;
}

template <typename Handle, typename T>
Handle* ToHandle(T* object) {
  return reinterpret_cast<Handle*>(static_cast<Tagged*>(object));
}

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_HANDLES_H_
