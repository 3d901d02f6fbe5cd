// A minimal error-or-value type: the analysis never throws and never aborts on bad input.
#ifndef FLEXNPU_XLA_PASSES_RESULT_H_
#define FLEXNPU_XLA_PASSES_RESULT_H_

#include <optional>
#include <string>
#include <utility>

namespace flexnpu::xla_passes {

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  static Result Error(std::string message) {
    Result r;
    r.error_ = message.empty() ? std::string("unknown error") : std::move(message);
    return r;
  }
  bool ok() const { return value_.has_value(); }
  const std::string& error() const { return error_; }
  const T& value() const& { return *value_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  const T* operator->() const { return &*value_; }
  T* operator->() { return &*value_; }

 private:
  Result() = default;
  std::optional<T> value_;
  std::string error_;
};

}  // namespace flexnpu::xla_passes

#endif  // FLEXNPU_XLA_PASSES_RESULT_H_
