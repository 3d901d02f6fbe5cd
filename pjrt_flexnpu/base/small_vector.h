// A vector that keeps up to N elements inline: the execute path sizes its argument and output
// lists per call without touching the heap for ordinary programs. Only the `size` elements in
// use are constructed (value-initialized) and destroyed, so a list of owners sized for eight
// devices costs one element's work on a single device.
#ifndef FLEXNPU_BASE_SMALL_VECTOR_H_
#define FLEXNPU_BASE_SMALL_VECTOR_H_

#include <cstddef>
#include <memory>
#include <new>

namespace flexnpu {

template <typename T, size_t N>
class SmallVector {
 public:
  explicit SmallVector(size_t size) : size_(size) {
    if (size > N) {
      heap_.reset(new T[size]());
      data_ = heap_.get();
    } else {
      data_ = std::launder(reinterpret_cast<T*>(inline_));
      std::uninitialized_value_construct_n(data_, size);
    }
  }
  ~SmallVector() {
    if (size_ <= N) std::destroy_n(data_, size_);
  }
  SmallVector(const SmallVector&) = delete;
  SmallVector& operator=(const SmallVector&) = delete;

  T* data() { return data_; }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }

 private:
  size_t size_;
  alignas(T) unsigned char inline_[N * sizeof(T)];
  std::unique_ptr<T[]> heap_;  // beyond N (a unique_ptr: cheaper to construct than a vector)
  T* data_;
};

}  // namespace flexnpu

#endif  // FLEXNPU_BASE_SMALL_VECTOR_H_
