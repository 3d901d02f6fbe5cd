// A vector that keeps up to N elements inline: the execute path sizes its argument and output
// lists per call without touching the heap for ordinary programs.
#ifndef FLEXNPU_RUNTIME_SMALL_VECTOR_H_
#define FLEXNPU_RUNTIME_SMALL_VECTOR_H_

#include <array>
#include <cstddef>
#include <type_traits>
#include <vector>

namespace flexnpu {

template <typename T, size_t N>
class SmallVector {
 public:
  explicit SmallVector(size_t size) : size_(size) {
    if (size > N) {
      heap_.resize(size);
      data_ = heap_.data();
    } else {
      if constexpr (std::is_trivially_default_constructible_v<T>) {
        for (size_t i = 0; i < size; ++i) inline_[i] = T();
      }
      data_ = inline_.data();
    }
  }
  SmallVector(const SmallVector&) = delete;
  SmallVector& operator=(const SmallVector&) = delete;

  T* data() { return data_; }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }

 private:
  size_t size_;
  std::array<T, N> inline_;
  std::vector<T> heap_;
  T* data_;
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_SMALL_VECTOR_H_
