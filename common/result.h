// Result<T>: expected failures as values. The error is one readable line that names the
// problem (field, value, limit); callers add context with `with_context`.
#pragma once
#include <string>
#include <utility>
#include <variant>

namespace troupe {

struct Error {
  std::string message;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Error e) : v_(std::move(e)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& operator*() { return std::get<0>(v_); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result<void> equivalent.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error e) : err_(std::move(e.message)), ok_(false) {}
  static Status success() { return {}; }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  Error error() const { return Error{err_}; }

 private:
  std::string err_;
  bool ok_ = true;
};

inline Error make_error(std::string msg) { return Error{std::move(msg)}; }

}  // namespace troupe

#define TROUPE_TRY(expr)                                     \
  do {                                                       \
    auto troupe_status_ = (expr);                            \
    if (!troupe_status_.ok()) return troupe_status_.error(); \
  } while (0)
