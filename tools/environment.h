// The environment variables the `memento` command reads, all in one place:
// the edge where they become options and process-wide settings, so that the
// library below never reads the environment (docs/architecture.md,
// "Settings and test hooks"). Trainers read theirs in Client::Connect.
#pragma once

#include <string>

#include "common/log.h"
#include "memento/status.h"

namespace memento::tools {

// MEMENTO_LOG_FORMAT (json, text) and MEMENTO_LOG_LEVEL (a spdlog level
// name), for InitLogging.
LogOptions LogOptionsFromEnvironment();

// The process-wide settings, applied once in main() before any command runs:
//   MEMENTO_COPY_KERNEL     snap::SelectCopyKernelUnlessChosen (a name this
//                           CPU cannot run: a warning, the default kept)
//   MEMENTO_SHM_HUGE_PAGES  off or 0: shm::SetHugePagesWanted(false)
//   MEMENTO_DURABLE_IO      auto, uring, pwrite: tier::Env::SetDefaultIoEngine
// InvalidArgument naming the variable for a value it does not take.
Status ApplyEnvironment();

// MEMENTO_ETCD_BIN: the etcd binary a benchmark starts (empty: `etcd`).
std::string EtcdBinaryFromEnvironment();

}  // namespace memento::tools
