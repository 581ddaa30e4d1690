// Test helper: a scratch directory on the shared-memory filesystem (where
// slots live in production), unique per test and removed afterwards.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/test_util.h"

namespace memento::shm::testing {

class ShmScratchDir {
 public:
  explicit ShmScratchDir(const std::string& prefix = "memento-test") {
    std::string tmpl = "/dev/shm/" + prefix + "-XXXXXX";
    if (char* made = mkdtemp(tmpl.data())) {
      path_ = made;
    } else {
      fallback_ = std::make_unique<memento::testing::ScratchDir>(prefix);
      path_ = fallback_->path();
    }
  }
  ~ShmScratchDir() {
    if (!fallback_ && std::getenv("MEMENTO_KEEP_TEST_DIRS") == nullptr) {
      memento::testing::RemoveTree(path_);
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<memento::testing::ScratchDir> fallback_;
};

}  // namespace memento::shm::testing
