#include "tools/environment.h"

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "fmt/format.h"
#include "shm/segment.h"
#include "snap/copy_kernel.h"
#include "tier/env.h"

namespace memento::tools {
namespace {

// The value of `name`, empty when unset.
std::string Get(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

LogOptions LogOptionsFromEnvironment() {
  LogOptions o;
  o.format = Get("MEMENTO_LOG_FORMAT");
  o.level = Get("MEMENTO_LOG_LEVEL");
  return o;
}

Status ApplyEnvironment() {
  if (const std::string kernel = Get("MEMENTO_COPY_KERNEL"); !kernel.empty()) {
    if (Status st = snap::SelectCopyKernelUnlessChosen(kernel); !st.ok()) {
      std::fprintf(stderr, "memento: MEMENTO_COPY_KERNEL: %s; using %s\n", st.message().c_str(),
                   snap::ActiveCopyKernel().name);
    }
  }
  if (const std::string huge = Get("MEMENTO_SHM_HUGE_PAGES"); !huge.empty()) {
    shm::SetHugePagesWanted(huge != "off" && huge != "0");
  }
  if (const std::string io = Get("MEMENTO_DURABLE_IO"); !io.empty()) {
    Result<tier::IoEngine> engine = tier::ParseIoEngine(io);
    if (!engine.ok()) return engine.status().WithContext("MEMENTO_DURABLE_IO");
    tier::Env::SetDefaultIoEngine(*engine);
  }
  return Status::Ok();
}

std::string EtcdBinaryFromEnvironment() { return Get("MEMENTO_ETCD_BIN"); }

}  // namespace memento::tools
