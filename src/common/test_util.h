// Helpers for tests: scratch directories, reproducible random seeds, reading
// a whole file.
#pragma once

#include <cstdint>
#include <string>

namespace memento::testing {

// A fresh directory under $MEMENTO_TEST_TMPDIR (or /tmp), removed with its
// contents when the object is destroyed unless MEMENTO_KEEP_TEST_DIRS is set.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix = "memento-test");
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The seed for a randomised test: $MEMENTO_TEST_SEED when set, else a fresh
// one. Prints "seed=<n> (rerun with MEMENTO_TEST_SEED=<n>)" to stderr.
uint64_t TestSeed(const char* test_name);

// Recursively removes `path` (best effort).
void RemoveTree(const std::string& path);

// The whole contents of the file at `path`; "" when it cannot be opened
// (tests print logs that may not exist yet).
std::string ReadAll(const std::string& path);

}  // namespace memento::testing
