#include "common/test_util.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <system_error>

namespace memento::testing {

ScratchDir::ScratchDir(const std::string& prefix) {
  const char* base = std::getenv("MEMENTO_TEST_TMPDIR");
  std::string root = base && *base ? base : "/tmp";
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  std::string tmpl = root + "/" + prefix + "-XXXXXX";
  char* made = mkdtemp(tmpl.data());
  if (made == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  path_ = made;
}

ScratchDir::~ScratchDir() {
  if (std::getenv("MEMENTO_KEEP_TEST_DIRS") == nullptr) RemoveTree(path_);
}

void RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

uint64_t TestSeed(const char* test_name) {
  uint64_t seed;
  if (const char* env = std::getenv("MEMENTO_TEST_SEED")) {
    seed = std::strtoull(env, nullptr, 10);
  } else {
    seed = std::random_device{}() ^
           static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  std::fprintf(stderr, "%s: seed=%llu (rerun with MEMENTO_TEST_SEED=%llu)\n", test_name,
               static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return seed;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace memento::testing
