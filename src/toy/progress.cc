#include "toy/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace memento::toy {

ProgressLog::~ProgressLog() {
  if (fd_ >= 0) close(fd_);
}

Status ProgressLog::Open(const std::string& path) {
  if (fd_ >= 0) close(fd_);
  fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd_ < 0) return ErrnoError("open progress file " + path, errno);
  return Status::Ok();
}

void ProgressLog::Emit(const std::string& line) const {
  if (fd_ < 0) return;
  const std::string l = line + "\n";
  if (write(fd_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) _exit(3);
}

void ProgressLog::Exit(const std::string& message, int code) const {
  Emit("E " + message);
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s\n", program_.c_str(), message.c_str());
  _exit(code);
}

namespace {

void ParseLine(const std::string& line, Progress* p) {
  std::istringstream ls(line);
  char kind = 0;
  ls >> kind;
  int64_t step = 0;
  uint64_t digest = 0;
  double x = 0, y = 0;
  if (kind == 'R' && ls >> step >> digest) {
    p->restored.emplace_back(step, digest);
    if (ls >> x >> y) {
      p->restore_s = x;
      p->seal_s = y;
    }
  } else if (kind == 'N') {
    p->fresh = true;
    if (ls >> y) p->seal_s = y;
  } else if (kind == 'D' && ls >> step >> digest) {
    p->digests[step] = digest;
  } else if (kind == 'S' && ls >> step) {
    p->max_started = std::max(p->max_started, step);
  } else if (kind == 'C' && ls >> step) {
    p->max_complete = std::max(p->max_complete, step);
    p->completed.push_back(step);
    if (ls >> x >> y) {
      p->copy_s_sum += x;
      p->fence_wait_s_sum += y;
    }
  } else if (kind == 'K' && ls >> step) {
    p->skipped.push_back(step);
  } else if (kind == 'X') {
    p->done = true;
  } else if (kind == 'E') {
    p->error = line.size() > 2 ? line.substr(2) : line;
  }
}

}  // namespace

Progress ReadProgress(const std::string& path) {
  Progress p;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) ParseLine(line, &p);
  return p;
}

}  // namespace memento::toy
