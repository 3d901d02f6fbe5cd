// Status and StatusOr: how FlexNPU's C++ layers report failure. The C API layer turns a
// non-OK Status into a PJRT_Error with the same code and message.
#ifndef FLEXNPU_BASE_STATUS_H_
#define FLEXNPU_BASE_STATUS_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace flexnpu {

// Numerically equal to PJRT_Error_Code (and absl::StatusCode).
enum class Code : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// OK is a null pointer: creating, moving and testing an OK status (every call on the dispatch
// path does so several times) touches no string.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message)
      : error_(code == Code::kOk ? nullptr : new Error{code, std::move(message)}) {}
  Status(const Status& other) : error_(other.error_ ? new Error(*other.error_) : nullptr) {}
  Status& operator=(const Status& other) {
    if (this != &other) error_.reset(other.error_ ? new Error(*other.error_) : nullptr);
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;
  static Status Ok() { return Status(); }

  bool ok() const { return error_ == nullptr; }
  Code code() const { return error_ ? error_->code : Code::kOk; }
  const std::string& message() const { return error_ ? error_->message : EmptyMessage(); }

 private:
  struct Error {
    Code code;
    std::string message;
  };
  static const std::string& EmptyMessage() {
    static const std::string* empty = new std::string();
    return *empty;
  }
  std::unique_ptr<Error> error_;
};

// The error makers are cold: a branch that ends in one is predicted not taken, so the compiler
// lays the building of its message out of the hot path (out of line, in .text.unlikely), and
// the dispatch path touches fewer instruction cache lines per call (bench/dispatch_capi.py
// --jax counts them).
#define FLEXNPU_COLD __attribute__((cold, noinline))
FLEXNPU_COLD inline Status InvalidArgument(std::string m) {
  return Status(Code::kInvalidArgument, std::move(m));
}
FLEXNPU_COLD inline Status NotFound(std::string m) { return Status(Code::kNotFound, std::move(m)); }
FLEXNPU_COLD inline Status Unimplemented(std::string m) {
  return Status(Code::kUnimplemented, std::move(m));
}
FLEXNPU_COLD inline Status Internal(std::string m) { return Status(Code::kInternal, std::move(m)); }
FLEXNPU_COLD inline Status FailedPrecondition(std::string m) {
  return Status(Code::kFailedPrecondition, std::move(m));
}
FLEXNPU_COLD inline Status ResourceExhausted(std::string m) {
  return Status(Code::kResourceExhausted, std::move(m));
}
FLEXNPU_COLD inline Status PermissionDenied(std::string m) {
  return Status(Code::kPermissionDenied, std::move(m));
}

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design
  StatusOr(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace flexnpu

#define FLEXNPU_RETURN_IF_ERROR(expr)        \
  do {                                       \
    ::flexnpu::Status _flexnpu_s = (expr);   \
    if (!_flexnpu_s.ok()) return _flexnpu_s; \
  } while (0)

#define FLEXNPU_STATUS_CONCAT_(a, b) a##b
#define FLEXNPU_STATUS_CONCAT(a, b) FLEXNPU_STATUS_CONCAT_(a, b)
// `lhs` (a declaration such as `auto x` or an lvalue) takes the value of the StatusOr `expr`,
// or the enclosing function returns its error.
#define FLEXNPU_ASSIGN_OR_RETURN(lhs, expr) \
  FLEXNPU_ASSIGN_OR_RETURN_(FLEXNPU_STATUS_CONCAT(_flexnpu_or_, __LINE__), lhs, expr)
#define FLEXNPU_ASSIGN_OR_RETURN_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#endif  // FLEXNPU_BASE_STATUS_H_
