// Helpers of the `memento bench ...` smoke tests: run the CLI through the
// shell, and find the work directory the bench names on stderr.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

namespace memento::bench_testing {

// Runs a shell command, returns (exit status, stdout).
inline std::pair<int, std::string> RunShell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, out};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The work directory the bench names on stderr ("... work dir PATH").
inline std::string WorkDir(const std::string& stderr_file) {
  std::ifstream in(stderr_file);
  std::string line;
  const std::string key = "work dir ";
  while (std::getline(in, line)) {
    size_t pos = line.find(key);
    if (pos != std::string::npos) return line.substr(pos + key.size());
  }
  return "";
}

// A fresh empty file in the temp directory, named `<prefix>-XXXXXX`, for a
// bench's stderr.
inline std::string StderrFile(const std::string& prefix) {
  std::string t = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  int fd = mkstemp(t.data());
  if (fd >= 0) close(fd);
  return t;
}

}  // namespace memento::bench_testing
