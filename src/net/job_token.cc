#include "net/job_token.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "net/socket.h"

namespace memento::net {

Result<JobToken> JobToken::FromSecret(std::string secret) {
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.size() < kMinBytes) {
    return InvalidArgumentError(
        fmt::format("job token is {} bytes; at least {} are required", secret.size(), kMinBytes));
  }
  return JobToken(std::move(secret));
}

Result<JobToken> JobToken::FromFile(const std::string& path) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return ErrnoError(fmt::format("open job token file {}", path), errno);
  struct stat st;
  if (fstat(fd.get(), &st) < 0) return ErrnoError(fmt::format("stat {}", path), errno);
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError(fmt::format("job token file {} is not a regular file", path));
  }
  if (st.st_uid != geteuid()) {
    return PermissionDeniedError(
        fmt::format("job token file {} is owned by uid {}, not by this user (uid {})", path,
                    st.st_uid, geteuid()));
  }
  if ((st.st_mode & 077) != 0) {
    return PermissionDeniedError(fmt::format(
        "job token file {} has mode {:04o}; it must not be accessible by group or others "
        "(chmod 600)",
        path, st.st_mode & 07777));
  }
  if (st.st_size > 4096) {
    return InvalidArgumentError(
        fmt::format("job token file {} is {} bytes (at most 4096)", path, st.st_size));
  }
  std::string s(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < s.size()) {
    ssize_t n = read(fd.get(), s.data() + got, s.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoError(fmt::format("read {}", path), n < 0 ? errno : EIO);
    got += static_cast<size_t>(n);
  }
  auto token = FromSecret(std::move(s));
  if (!token.ok()) return token.status().WithContext(path);
  return token;
}

Result<JobToken> JobToken::FromEnv() {
  const char* env = std::getenv("MEMENTO_JOB_TOKEN");
  if (env == nullptr) {
    return NotFoundError("no job token: pass a token file or set MEMENTO_JOB_TOKEN");
  }
  auto token = FromSecret(env);
  if (!token.ok()) return token.status().WithContext("MEMENTO_JOB_TOKEN");
  return token;
}

Result<JobToken> JobToken::Load(const std::string& path) {
  return path.empty() ? FromEnv() : FromFile(path);
}

Status JobToken::WriteFile(const std::string& path) const {
  const std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  ::unlink(tmp.c_str());  // a leftover of a process that had this pid
  Fd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return ErrnoError(fmt::format("create job token file {}", tmp), errno);
  auto fail = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    return ErrnoError(fmt::format("{} job token file {}", what, tmp), err);
  };
  const std::string s = secret_ + "\n";
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = write(fd.get(), s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("write", n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
  }
  // The umask may have narrowed 0600, never widened it; make it exact.
  if (fchmod(fd.get(), 0600) != 0) return fail("chmod", errno);
  if (fsync(fd.get()) != 0) return fail("fsync", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(fmt::format("rename {} to job token file {}", tmp, path), err);
  }
  return Status::Ok();
}

Result<JobToken> JobToken::Generate() {
  unsigned char raw[32];
  size_t got = 0;
  while (got < sizeof(raw)) {
    ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("getrandom", errno);
    got += static_cast<size_t>(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : raw) {
    s.push_back(kHex[c >> 4]);
    s.push_back(kHex[c & 15]);
  }
  return JobToken(std::move(s));
}

}  // namespace memento::net
