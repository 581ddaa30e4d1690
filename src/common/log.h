// Logging: a thin layer over spdlog so that every part of memento logs the same
// way. Level and format come from LogOptions, which the process's edge fills
// (the `memento` command from MEMENTO_LOG_LEVEL and MEMENTO_LOG_FORMAT:
// tools/environment.h). Output goes to stderr with time, level, process tag
// and message; with the json format one JSON object per line instead
// ("time", "level", "process", "pid", "thread", "source" when known, "msg";
// docs/operating.md, "Structured logs").
//
//   MEMENTO_LOG_INFO("agent: adopted slot {} of rank {} at step {}", slot, rank, step);
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace memento {

struct LogOptions {
  // "json": one JSON object per line; "text" or empty: text lines. Any other
  // value logs text and a warning naming it.
  std::string format;
  // A spdlog level name (trace, debug, info, warn, err, critical, off);
  // empty: info.
  std::string level;
};

// Names this process in every log line ("agent node0", "trainer rank3").
// Call once early in main(); safe to call again.
void InitLogging(const std::string& process_tag, const LogOptions& options = {});

// Whether the last InitLogging chose the json format: tools that print status
// lines of their own on stdout print them as JSON objects too.
bool JsonLogging();

}  // namespace memento

#define MEMENTO_LOG_TRACE(...) SPDLOG_TRACE(__VA_ARGS__)
#define MEMENTO_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define MEMENTO_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define MEMENTO_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define MEMENTO_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
