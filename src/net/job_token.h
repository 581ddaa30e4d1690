// The job token: the shared secret every process of one job holds. It
// authenticates agents, trainers and the coordination store to each other
// (docs/transport.md). The secret is never logged or printed.
#pragma once

#include <string>

#include "memento/status.h"

namespace memento::net {

class JobToken {
 public:
  // Minimum secret length in bytes.
  static constexpr size_t kMinBytes = 16;

  // Reads the token from `path`. The file must be a regular file owned by
  // this user and not readable or writable by group or others (mode 0600 or
  // 0400); one trailing newline is stripped. PermissionDenied on a loose
  // mode, InvalidArgument when shorter than kMinBytes.
  [[nodiscard]] static Result<JobToken> FromFile(const std::string& path);
  // Reads MEMENTO_JOB_TOKEN. NotFound when unset.
  [[nodiscard]] static Result<JobToken> FromEnv();
  // `path` when not empty, else the environment.
  [[nodiscard]] static Result<JobToken> Load(const std::string& path);
  // From bytes in memory (tests, launchers that generate a token).
  [[nodiscard]] static Result<JobToken> FromSecret(std::string secret);
  // 32 random bytes, hex-encoded (64 characters).
  [[nodiscard]] static Result<JobToken> Generate();

  // The secret; only for HMAC keys and for writing a token file.
  const std::string& secret() const { return secret_; }

  // Writes the secret and a newline to `path` as FromFile reads it: mode
  // 0600, through a temporary file in the same directory that is fsynced
  // and renamed over `path`, so a reader sees the old file or the whole new
  // one, and a file already there (whatever its mode, or a symbolic link)
  // is replaced, never written through. Errors name the path; nothing is
  // left behind on failure.
  [[nodiscard]] Status WriteFile(const std::string& path) const;

 private:
  explicit JobToken(std::string s) : secret_(std::move(s)) {}
  std::string secret_;
};

}  // namespace memento::net
