#include "common/log.h"

#include <spdlog/formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>

#include "fmt/format.h"

namespace memento {
namespace {

// The json format (MEMENTO_LOG_FORMAT=json): one JSON object per line (docs/operating.md,
// "Structured logs"). nlohmann::json escapes the message; bytes that are not
// UTF-8 are replaced rather than dropping the line.
class JsonFormatter final : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string process) : process_(std::move(process)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    using std::chrono::duration_cast;
    const auto since_epoch = msg.time.time_since_epoch();
    const auto secs = duration_cast<std::chrono::seconds>(since_epoch);
    const auto ms = duration_cast<std::chrono::milliseconds>(since_epoch - secs).count();
    std::time_t t = secs.count();
    std::tm tm{};
    gmtime_r(&t, &tm);
    char when[40];
    std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    nlohmann::json j;
    j["time"] = fmt::format("{}.{:03d}Z", when, static_cast<int>(ms));
    const auto level = spdlog::level::to_string_view(msg.level);
    j["level"] = std::string(level.data(), level.size());
    j["process"] = process_;
    j["pid"] = static_cast<int64_t>(getpid());
    j["thread"] = static_cast<uint64_t>(msg.thread_id);
    if (!msg.source.empty()) {
      j["source"] = fmt::format("{}:{}", msg.source.filename, msg.source.line);
    }
    j["msg"] = std::string(msg.payload.data(), msg.payload.size());
    const std::string line =
        j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    dest.append(line.data(), line.data() + line.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>(process_);
  }

 private:
  const std::string process_;
};

std::atomic<bool> json_logging{false};

}  // namespace

bool JsonLogging() { return json_logging.load(std::memory_order_relaxed); }

void InitLogging(const std::string& process_tag, const LogOptions& options) {
  auto logger = spdlog::stderr_logger_mt("memento-" + process_tag + "-" +
                                         std::to_string(reinterpret_cast<uintptr_t>(&process_tag)));
  const std::string& fmt_name = options.format;
  json_logging.store(fmt_name == "json", std::memory_order_relaxed);
  if (fmt_name == "json") {
    logger->set_formatter(std::make_unique<JsonFormatter>(process_tag));
  } else {
    logger->set_pattern("%H:%M:%S.%e %^%L%$ [" + process_tag + "] %v");
  }
  spdlog::level::level_enum level = spdlog::level::info;
  if (!options.level.empty()) level = spdlog::level::from_str(options.level);
  logger->set_level(level);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  if (!fmt_name.empty() && fmt_name != "json" && fmt_name != "text") {
    MEMENTO_LOG_WARN(
        "log format '{}' (MEMENTO_LOG_FORMAT) is not a log format (json or text): logging text",
        fmt_name);
  }
}

}  // namespace memento
