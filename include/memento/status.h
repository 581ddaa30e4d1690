// Status and Result<T>: how every fallible memento call reports failure.
//
// memento has no exceptions in its core. A call that can fail returns a Status
// (no value) or a Result<T> (a value or a Status). Both are [[nodiscard]].
//
//   Result<Slot> slot = arena.OpenSlot(rank);
//   if (!slot.ok()) return slot.status();
//   MEMENTO_ASSIGN_OR_RETURN(auto plan, Planner::Plan(topology, policy));
//   MEMENTO_RETURN_IF_ERROR(store.Set(key, value, deadline));
//
// Messages name the value that was wrong and what was expected, so a user can
// act on them without reading the source.
//
// Thread safety: Status and Result are values; distinct objects may be used
// from distinct threads, one object is not synchronised.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace memento {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,     // the caller passed something wrong
  kNotFound = 2,            // a named thing (job, version, tensor, file) does not exist
  kAlreadyExists = 3,       // creating something that is already there
  kFailedPrecondition = 4,  // the system is not in the state the call needs
  kResourceExhausted = 5,   // memory budget, /dev/shm, disk, descriptors
  kUnavailable = 6,         // a peer, agent or store cannot be reached (retryable)
  kDeadlineExceeded = 7,    // a blocking call ran past its deadline
  kAborted = 8,             // the operation was cancelled or lost a race
  kDataLoss = 9,            // bytes are torn or fail their checksum
  kInternal = 10,           // a bug or an unexpected OS error
  kPermissionDenied = 11,   // authentication or uid check failed
};

// Returns "InvalidArgument", "DataLoss", ...
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  // An OK status.
  Status() = default;
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  // Empty for OK.
  const std::string& message() const;

  // "DataLoss: slot 1 of rank 3: chunk 17 checksum mismatch". "OK" for OK.
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <old message>". OK stays OK.
  Status WithContext(std::string_view context) const;

  // Ignores the status explicitly (for best-effort cleanup paths).
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }
  friend bool operator!=(const Status& a, const Status& b) { return !(a == b); }

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  // Null for OK, so an OK status costs one pointer and no allocation.
  std::shared_ptr<const State> state_;
};

std::ostream& operator<<(std::ostream& os, const Status& status);

// Convenience constructors: InvalidArgumentError(fmt::format("dp={} must be >= 1", dp)).
Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status FailedPreconditionError(std::string message);
Status ResourceExhaustedError(std::string message);
Status UnavailableError(std::string message);
Status DeadlineExceededError(std::string message);
Status AbortedError(std::string message);
Status DataLossError(std::string message);
Status InternalError(std::string message);
Status PermissionDeniedError(std::string message);

// Status from an errno value: "<what>: <strerror(err)>", code chosen from errno
// (ENOENT -> NotFound, ENOSPC/ENOMEM -> ResourceExhausted, EACCES -> PermissionDenied...).
Status ErrnoError(std::string_view what, int err);

// A value of type T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  static_assert(!std::is_same_v<std::decay_t<T>, Status>, "Result<Status> is not allowed");

  // REQUIRES: !status.ok()
  Result(Status status) : v_(std::move(status)) {  // NOLINT(runtime/explicit)
    if (std::get<Status>(v_).ok()) {
      v_ = Status(StatusCode::kInternal, "Result constructed from an OK status without a value");
    }
  }
  Result(const T& value) : v_(value) {}        // NOLINT(runtime/explicit)
  Result(T&& value) : v_(std::move(value)) {}  // NOLINT(runtime/explicit)
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<U&&, T> &&
                                                    !std::is_same_v<std::decay_t<U>, T> &&
                                                    !std::is_same_v<std::decay_t<U>, Status>>>
  Result(U&& value) : v_(T(std::forward<U>(value))) {}  // NOLINT(runtime/explicit)

  bool ok() const { return std::holds_alternative<T>(v_); }
  // OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  // REQUIRES: ok(). Aborts with the status otherwise (a programming error).
  T& value() & {
    CheckOk();
    return std::get<T>(v_);
  }
  const T& value() const& {
    CheckOk();
    return std::get<T>(v_);
  }
  T&& value() && {
    CheckOk();
    return std::get<T>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  T value_or(T fallback) const& { return ok() ? std::get<T>(v_) : std::move(fallback); }

 private:
  void CheckOk() const;
  std::variant<Status, T> v_;
};

namespace internal {
[[noreturn]] void DieOnBadResultAccess(const Status& status);
}  // namespace internal

template <typename T>
void Result<T>::CheckOk() const {
  if (!ok()) internal::DieOnBadResultAccess(std::get<Status>(v_));
}

}  // namespace memento

#define MEMENTO_STATUS_CONCAT_INNER_(a, b) a##b
#define MEMENTO_STATUS_CONCAT_(a, b) MEMENTO_STATUS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define MEMENTO_RETURN_IF_ERROR(expr)                          \
  do {                                                         \
    ::memento::Status memento_status_tmp_ = (expr);            \
    if (!memento_status_tmp_.ok()) return memento_status_tmp_; \
  } while (0)

// `lhs` = value of `rexpr` (a Result<T>), or returns its status from the
// enclosing function.
#define MEMENTO_ASSIGN_OR_RETURN(lhs, rexpr) \
  MEMENTO_ASSIGN_OR_RETURN_IMPL_(MEMENTO_STATUS_CONCAT_(memento_result_, __LINE__), lhs, rexpr)
#define MEMENTO_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                   \
  if (!tmp.ok()) return tmp.status();                   \
  lhs = std::move(tmp).value()
