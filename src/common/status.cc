#include "memento/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace memento {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kResourceExhausted:
      return "ResourceExhausted";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kDeadlineExceeded:
      return "DeadlineExceeded";
    case StatusCode::kAborted:
      return "Aborted";
    case StatusCode::kDataLoss:
      return "DataLoss";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kPermissionDenied:
      return "PermissionDenied";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) {
    state_ = std::make_shared<const State>(State{code, std::move(message)});
  }
}

const std::string& Status::message() const {
  static const std::string* const kEmpty = new std::string();
  return state_ ? state_->message : *kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code()));
  out += ": ";
  out += message();
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message();
  return Status(code(), std::move(msg));
}

std::ostream& operator<<(std::ostream& os, const Status& status) { return os << status.ToString(); }

Status InvalidArgumentError(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
Status NotFoundError(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
Status AlreadyExistsError(std::string m) {
  return Status(StatusCode::kAlreadyExists, std::move(m));
}
Status FailedPreconditionError(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
Status ResourceExhaustedError(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
Status UnavailableError(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
Status DeadlineExceededError(std::string m) {
  return Status(StatusCode::kDeadlineExceeded, std::move(m));
}
Status AbortedError(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
Status DataLossError(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
Status InternalError(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
Status PermissionDeniedError(std::string m) {
  return Status(StatusCode::kPermissionDenied, std::move(m));
}

Status ErrnoError(std::string_view what, int err) {
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case ENOENT:
      code = StatusCode::kNotFound;
      break;
    case EEXIST:
      code = StatusCode::kAlreadyExists;
      break;
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EDQUOT:
      code = StatusCode::kResourceExhausted;
      break;
    case EACCES:
    case EPERM:
      code = StatusCode::kPermissionDenied;
      break;
    case EINVAL:
      code = StatusCode::kInvalidArgument;
      break;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EAGAIN:
      code = StatusCode::kUnavailable;
      break;
    case ETIMEDOUT:
      code = StatusCode::kDeadlineExceeded;
      break;
    default:
      break;
  }
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  return Status(code, std::move(msg));
}

namespace internal {
void DieOnBadResultAccess(const Status& status) {
  std::fprintf(stderr, "memento: value() called on a failed Result: %s\n",
               status.ToString().c_str());
  std::abort();
}
}  // namespace internal

}  // namespace memento
