// Where the `memento` tools find the reference trainer (memento-trainer):
// the --trainer flag, else next to this binary in a build tree
// (build/tools/memento -> build/examples/trainer/memento-trainer), else $PATH.
// tools/ does not link examples/, so the trainer always runs as a subprocess.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "memento/status.h"

namespace memento::tools {

// This binary's path ("" when /proc/self/exe cannot be read).
inline std::string SelfExe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

inline bool IsExecutable(const std::string& p) {
  return !p.empty() && access(p.c_str(), X_OK) == 0;
}

inline Result<std::string> FindTrainer(const std::string& flag) {
  if (!flag.empty()) {
    if (IsExecutable(flag)) return flag;
    return InvalidArgumentError("--trainer " + flag + " is not an executable");
  }
  std::filesystem::path self = SelfExe();
  if (!self.empty()) {
    for (const char* rel : {"../examples/trainer/memento-trainer", "memento-trainer"}) {
      std::string c = (self.parent_path() / rel).lexically_normal().string();
      if (IsExecutable(c)) return c;
    }
  }
  if (const char* path = std::getenv("PATH")) {
    std::string all = path;
    size_t start = 0;
    while (start <= all.size()) {
      size_t end = all.find(':', start);
      if (end == std::string::npos) end = all.size();
      std::string c = all.substr(start, end - start) + "/memento-trainer";
      if (end > start && IsExecutable(c)) return c;
      start = end + 1;
    }
  }
  return NotFoundError(
      "memento-trainer not found (next to memento, in ../examples/trainer, or on PATH); pass "
      "--trainer PATH");
}

}  // namespace memento::tools
