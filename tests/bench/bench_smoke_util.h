// Helpers of the `memento bench ...` smoke tests: run the CLI through the
// shell, and find the work directory the bench names on stderr.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "common/shell_test_util.h"

namespace memento::bench_testing {

// Runs a shell command, returns (exit status, stdout).
using memento::testing::RunShell;

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
