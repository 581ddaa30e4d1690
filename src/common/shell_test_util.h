// Test helper (memento_test_util): running a command through the shell, for
// the tests that drive the `memento` CLI and other binaries as real processes.
#pragma once

#include <string>
#include <utility>

namespace memento::testing {

// Runs `command` through the shell (popen) and returns its exit status (-1
// when it could not start or did not exit normally) and its standard output.
// Append " 2>&1" to the command to capture its standard error as well.
std::pair<int, std::string> RunShell(const std::string& command);

}  // namespace memento::testing
