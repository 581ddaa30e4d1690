#include "common/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <string>

namespace memento {

void InitLogging(const std::string& process_tag) {
  auto logger = spdlog::stderr_logger_mt("memento-" + process_tag + "-" +
                                         std::to_string(reinterpret_cast<uintptr_t>(&process_tag)));
  logger->set_pattern("%H:%M:%S.%e %^%L%$ [" + process_tag + "] %v");
  spdlog::level::level_enum level = spdlog::level::info;
  if (const char* env = std::getenv("MEMENTO_LOG_LEVEL")) {
    level = spdlog::level::from_str(env);
  }
  logger->set_level(level);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace memento
