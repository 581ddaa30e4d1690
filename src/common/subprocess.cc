#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

extern char** environ;

namespace memento {

std::string ExitStatus::ToString() const {
  if (signal != 0) {
    const char* name = strsignal(signal);
    return "killed by signal " + std::to_string(signal) + " (" + (name ? name : "?") + ")";
  }
  return "exit code " + std::to_string(code);
}

ExitStatus ExitStatus::FromWaitStatus(int ws) {
  ExitStatus s;
  if (WIFEXITED(ws)) {
    s.code = WEXITSTATUS(ws);
  } else if (WIFSIGNALED(ws)) {
    s.signal = WTERMSIG(ws);
  }
  return s;
}

namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

}  // namespace

Result<std::string> FindExecutable(const std::string& name) {
  if (name.empty()) return InvalidArgumentError("empty program name");
  if (name.find('/') != std::string::npos) {
    if (IsExecutableFile(name)) return name;
    return NotFoundError("program '" + name + "' does not exist or is not executable");
  }
  const char* path = std::getenv("PATH");
  std::string all = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(':', start);
    if (end == std::string::npos) end = all.size();
    std::string dir = all.substr(start, end - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    if (IsExecutableFile(candidate)) return candidate;
    start = end + 1;
  }
  return NotFoundError("program '" + name + "' not found on PATH");
}

Subprocess::~Subprocess() {
  if (running()) {
    kill(pid_, SIGKILL);
    int ws;
    while (waitpid(pid_, &ws, 0) < 0 && errno == EINTR) {
    }
  }
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), group_(other.group_), status_(other.status_) {
  other.pid_ = -1;
  other.status_.reset();
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    this->~Subprocess();
    pid_ = other.pid_;
    group_ = other.group_;
    status_ = other.status_;
    other.pid_ = -1;
    other.status_.reset();
  }
  return *this;
}

Result<Subprocess> Subprocess::Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return InvalidArgumentError("spawn: empty argv");
  MEMENTO_ASSIGN_OR_RETURN(std::string program, FindExecutable(options.argv[0]));

  // Everything the child needs is prepared here: between fork and exec a
  // multi-threaded parent's child may only call async-signal-safe functions.
  std::map<std::string, std::string> env_map;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env_map[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const std::string& kv : options.env) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgumentError("spawn: environment entry '" + kv + "' is not KEY=VALUE");
    }
    env_map[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  std::vector<std::string> env_strings;
  env_strings.reserve(env_map.size());
  for (const auto& [k, v] : env_map) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = options.argv;
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  int log_fd = -1;
  if (!options.log_path.empty()) {
    log_fd = open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (log_fd < 0) return ErrnoError("open log " + options.log_path, errno);
  }
  const pid_t parent = getpid();
  const char* cwd = options.cwd.empty() ? nullptr : options.cwd.c_str();
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    if (log_fd >= 0) close(log_fd);
    return ErrnoError("fork", err);
  }
  if (pid == 0) {
    if (options.die_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(126);
    }
    if (options.new_process_group) setpgid(0, 0);
    // Default signal dispositions and an empty mask, whatever the parent set.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    if (log_fd >= 0) {
      dup2(log_fd, 1);
      dup2(log_fd, 2);
    }
    if (cwd != nullptr && chdir(cwd) != 0) _exit(126);
    execve(program.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  if (log_fd >= 0) close(log_fd);
  Subprocess p;
  p.pid_ = pid;
  p.group_ = options.new_process_group;
  return p;
}

std::optional<ExitStatus> Subprocess::Poll() {
  if (status_.has_value() || pid_ <= 0) return status_;
  int ws = 0;
  pid_t r = waitpid(pid_, &ws, WNOHANG);
  if (r == pid_) status_ = ExitStatus::FromWaitStatus(ws);
  return status_;
}

Result<ExitStatus> Subprocess::Wait(Deadline deadline) {
  if (pid_ <= 0) return FailedPreconditionError("wait: no child");
  auto sleep = std::chrono::microseconds(200);
  while (!Poll().has_value()) {
    if (deadline.expired()) {
      return DeadlineExceededError("process " + std::to_string(pid_) + " still running");
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min<std::chrono::microseconds>(sleep * 2, std::chrono::milliseconds(10));
  }
  return *status_;
}

Status Subprocess::Kill(int sig) {
  if (!unreaped()) return Status::Ok();
  if (kill(pid_, sig) != 0 && errno != ESRCH) return ErrnoError("kill", errno);
  return Status::Ok();
}

Status Subprocess::KillGroup(int sig) {
  if (!group_) return FailedPreconditionError("kill group: the child was not spawned as a group");
  if (!unreaped()) return Status::Ok();
  if (kill(-pid_, sig) != 0 && errno != ESRCH) return ErrnoError("kill group", errno);
  return Status::Ok();
}

ExitStatus Subprocess::Terminate(double grace_s) {
  if (pid_ <= 0) return ExitStatus{};
  if (auto s = Poll()) return *s;
  Kill(SIGTERM).IgnoreError();
  auto st = Wait(Deadline::AfterSeconds(grace_s));
  if (st.ok()) return *st;
  Kill(SIGKILL).IgnoreError();
  int ws = 0;
  while (waitpid(pid_, &ws, 0) < 0 && errno == EINTR) {
  }
  status_ = ExitStatus::FromWaitStatus(ws);
  return *status_;
}

pid_t Subprocess::Release() {
  pid_t p = pid_;
  pid_ = -1;
  status_.reset();
  return p;
}

std::string TailFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  std::streamoff start = size > static_cast<std::streamoff>(max_bytes)
                             ? size - static_cast<std::streamoff>(max_bytes)
                             : 0;
  in.seekg(start);
  std::string out(static_cast<size_t>(size - start), '\0');
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  return out;
}

}  // namespace memento
