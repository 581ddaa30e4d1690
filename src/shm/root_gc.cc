#include "shm/root_gc.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fmt/format.h"
#include "shm/protocol.h"

namespace memento::shm {
namespace {

namespace fs = std::filesystem;

bool IsDir(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// A directory that an agent made a node root of: it holds the agent's lock
// or socket, or slot files.
bool LooksLikeNodeRoot(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  bool yes = false;
  while (dirent* e = readdir(d)) {
    int rank = -1, slot = -1, n = 0;
    std::string name = e->d_name;
    if (name == "agent.lock" || name == "agent.sock" ||
        (std::sscanf(e->d_name, "rank%d.slot%d%n", &rank, &slot, &n) == 2 &&
         e->d_name[n] == '\0')) {
      yes = true;
      break;
    }
  }
  closedir(d);
  return yes;
}

std::vector<std::string> SubDirs(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string path = dir + "/" + name;
    if (IsDir(path)) out.push_back(path);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t TreeBytes(const std::string& root) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec),
       end;
       !ec && it != end; it.increment(ec)) {
    struct stat st;
    if (lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return bytes;
}

pid_t ReadLockPid(const std::string& lock_path) {
  std::ifstream in(lock_path);
  long pid = -1;
  if (in >> pid && pid > 0) return static_cast<pid_t>(pid);
  return -1;
}

// Fills everything but `live`/`why`, which the caller decides (with or
// without holding the lock itself).
void ProbeFacts(const std::string& root, NodeRootState* s) {
  s->root = root;
  s->agent_pid = ReadLockPid(root + "/agent.lock");
  s->agent_pid_alive = s->agent_pid > 0 && (kill(s->agent_pid, 0) == 0 || errno == EPERM);
  s->mapped_by = ProcessesMapping(root);
  s->bytes = TreeBytes(root);
}

// The pid holding a flock on `path`, from /proc/locks (without taking the
// lock, which would make an agent starting at that instant fail); -1 when
// nobody holds one.
pid_t FlockHolder(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return -1;
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    // "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF"
    char kind[16], mode[16], access[16];
    long pid = 0;
    unsigned maj = 0, min = 0;
    unsigned long long ino = 0;
    const char* p = std::strchr(line.c_str(), ':');
    if (p == nullptr || std::sscanf(p + 1, "%15s %15s %15s %ld %x:%x:%llu", kind, mode, access,
                                    &pid, &maj, &min, &ino) != 7) {
      continue;
    }
    if (std::strcmp(kind, "FLOCK") == 0 && ino == st.st_ino && maj == major(st.st_dev) &&
        min == minor(st.st_dev)) {
      return static_cast<pid_t>(pid);
    }
  }
  return -1;
}

bool SocketAnswers(const std::string& root) {
  auto fd = ConnectUnix(AgentSocketPath(root));
  if (!fd.ok()) return false;
  close(*fd);
  return true;
}

// The reasons a root whose lock is free is still live; empty when dead.
std::string LiveWithoutLock(const std::string& root, const NodeRootState& s) {
  if (SocketAnswers(root)) return "something answers on " + AgentSocketPath(root);
  if (!s.mapped_by.empty()) {
    return fmt::format("its files are mapped by pid {} (a trainer still running?)",
                       fmt::join(s.mapped_by, ", "));
  }
  return "";
}

std::string DeadFacts(const std::string& root, const NodeRootState& s) {
  std::string who = s.agent_pid > 0 ? fmt::format("agent pid {} is {}", s.agent_pid,
                                                  s.agent_pid_alive ? "alive but does not hold "
                                                                      "the lock (pid reused?)"
                                                                    : "gone")
                                    : "no agent pid recorded";
  return fmt::format("{}; agent.lock is free; {} does not answer; no process maps its files", who,
                     AgentSocketPath(root));
}

}  // namespace

std::string DefaultRootBase() { return "/dev/shm/memento"; }

std::vector<pid_t> ProcessesMapping(const std::string& dir) {
  std::vector<pid_t> out;
  const std::string prefix = dir + "/";
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::ifstream maps(fmt::format("/proc/{}/maps", pid));
    std::string line;
    while (std::getline(maps, line)) {
      size_t slash = line.find('/');
      if (slash != std::string::npos && line.compare(slash, prefix.size(), prefix) == 0) {
        out.push_back(static_cast<pid_t>(pid));
        break;
      }
    }
  }
  closedir(proc);
  std::sort(out.begin(), out.end());
  return out;
}

Result<std::vector<std::string>> FindNodeRoots(const std::string& base) {
  if (!IsDir(base)) return NotFoundError("root base " + base + " is not a directory");
  std::vector<std::string> out;
  for (const std::string& dir : SubDirs(base)) {
    if (LooksLikeNodeRoot(dir)) {
      out.push_back(dir);
      continue;
    }
    for (const std::string& sub : SubDirs(dir)) {
      if (LooksLikeNodeRoot(sub)) out.push_back(sub);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<NodeRootState> ProbeNodeRoot(const std::string& root) {
  if (!IsDir(root)) return NotFoundError("node root " + root + " is not a directory");
  NodeRootState s;
  ProbeFacts(root, &s);
  if (pid_t holder = FlockHolder(root + "/agent.lock"); holder > 0) {
    s.live = true;
    s.why = fmt::format("agent pid {} holds agent.lock", holder);
    return s;
  }
  s.why = LiveWithoutLock(root, s);
  s.live = !s.why.empty();
  if (!s.live) s.why = DeadFacts(root, s);
  return s;
}

Result<uint64_t> RemoveNodeRootTree(const std::string& root) {
  uint64_t bytes = TreeBytes(root);
  std::error_code ec;
  fs::remove_all(root, ec);
  if (ec) return InternalError(fmt::format("removing {}: {}", root, ec.message()));
  return bytes;
}

Result<uint64_t> RemoveDeadNodeRoot(const std::string& root) {
  if (!IsDir(root)) return NotFoundError("node root " + root + " is not a directory");
  struct stat st;
  if (lstat(root.c_str(), &st) != 0) return ErrnoError("stat " + root, errno);
  if (st.st_uid != geteuid()) {
    return PermissionDeniedError(
        fmt::format("node root {} belongs to uid {}, not to uid {}", root, st.st_uid, geteuid()));
  }
  // Hold the lock across the check and the removal: an agent starting on the
  // root now fails to take it (and says so) instead of adopting half a root.
  const std::string lock_path = root + "/agent.lock";
  if (pid_t holder = FlockHolder(lock_path); holder > 0) {
    return FailedPreconditionError(
        fmt::format("{} is live: agent pid {} holds agent.lock", root, holder));
  }
  int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoError("open " + lock_path, errno);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    close(fd);
    if (err == EWOULDBLOCK) {
      return FailedPreconditionError(
          fmt::format("{} is live: agent pid {} holds agent.lock", root, ReadLockPid(lock_path)));
    }
    return ErrnoError("flock " + lock_path, err);
  }
  NodeRootState s;
  ProbeFacts(root, &s);
  std::string live = LiveWithoutLock(root, s);
  if (!live.empty()) {
    close(fd);
    return FailedPreconditionError(fmt::format("{} is live: {}", root, live));
  }
  auto freed = RemoveNodeRootTree(root);
  close(fd);
  return freed;
}

}  // namespace memento::shm
