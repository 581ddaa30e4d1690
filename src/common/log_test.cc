// LogOptions::format "json" (MEMENTO_LOG_FORMAT=json for the `memento`
// command, tools/environment.h): every line a process logs is one JSON object
// (docs/operating.md, "Structured logs"). The logging runs in a forked child
// whose stderr is a pipe, as an agent's would be.
#include "common/log.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace memento {
namespace {

std::string LogInChild(const char* format) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    LogOptions options;
    if (format != nullptr) options.format = format;
    InitLogging("agent node7", options);
    MEMENTO_LOG_INFO("plain message {}", 42);
    MEMENTO_LOG_WARN("quotes \" backslash \\ newline\nand tab\t");
    MEMENTO_LOG_ERROR("not utf-8: {}", std::string("\xff\xfe"));
    _exit(JsonLogging() ? 3 : 0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), format != nullptr && std::string(format) == "json" ? 3 : 0);
  return out;
}

TEST(LogTest, JsonFormatWritesOneObjectPerLine) {
  const std::string out = LogInChild("json");
  std::istringstream in(out);
  std::string line;
  std::vector<nlohmann::json> records;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line << "\nin:\n" << out;
    records.push_back(j);
  }
  ASSERT_EQ(records.size(), 3u) << out;
  EXPECT_EQ(records[0]["msg"], "plain message 42");
  EXPECT_EQ(records[0]["level"], "info");
  EXPECT_EQ(records[0]["process"], "agent node7");
  EXPECT_TRUE(records[0]["pid"].is_number_integer());
  EXPECT_TRUE(records[0]["time"].is_string());
  EXPECT_EQ(records[0]["time"].get<std::string>().back(), 'Z');
  EXPECT_NE(records[0]["source"].get<std::string>().find("log_test.cc:"), std::string::npos);
  EXPECT_EQ(records[1]["msg"], "quotes \" backslash \\ newline\nand tab\t");
  EXPECT_EQ(records[1]["level"], "warning");
  EXPECT_EQ(records[2]["level"], "error");
  EXPECT_EQ(records[2]["msg"].get<std::string>().rfind("not utf-8: ", 0), 0u);
}

TEST(LogTest, TextFormatStaysTheDefault) {
  const std::string out = LogInChild(nullptr);
  EXPECT_NE(out.find("I [agent node7] plain message 42\n"), std::string::npos) << out;
  EXPECT_EQ(out.find('{'), std::string::npos) << out;
}

TEST(LogTest, AnUnknownFormatIsNamedAndTextIsUsed) {
  const std::string out = LogInChild("yaml");
  EXPECT_NE(out.find("'yaml' (MEMENTO_LOG_FORMAT) is not a log format (json or text)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("plain message 42"), std::string::npos) << out;
}

}  // namespace
}  // namespace memento
