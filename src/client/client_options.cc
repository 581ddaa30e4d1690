#include "client/client_options.h"

#include <cstdlib>
#include <string_view>

#include "common/log.h"
#include "fmt/format.h"
#include "shm/node_store.h"
#include "shm/slot.h"
#include "snap/copy_kernel.h"

namespace memento {
namespace client {

Status ValidateClientOptions(const ClientOptions& options) {
  if (options.rank < 0 || options.world_size < 1 || options.rank >= options.world_size) {
    return InvalidArgumentError(
        fmt::format("rank {} must be in [0, world_size {})", options.rank, options.world_size));
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes % (64 << 10) != 0) {
    return InvalidArgumentError(
        fmt::format("chunk_bytes {} must be a positive multiple of 64 KiB", options.chunk_bytes));
  }
  if (options.copy_threads < 1 || options.copy_threads > 64) {
    return InvalidArgumentError(
        fmt::format("copy_threads {} must be in [1, 64]", options.copy_threads));
  }
  if (CopyPriorityName(options.copy_priority).empty()) {
    return InvalidArgumentError(fmt::format("copy_priority {} is not one of: idle, normal",
                                            static_cast<int>(options.copy_priority)));
  }
  if (ScheduleName(options.schedule).empty()) {
    return InvalidArgumentError(fmt::format("schedule {} is not one of: auto, eager, has",
                                            static_cast<int>(options.schedule)));
  }
  const HasTuning& has = options.has;
  if (has.pipeline_stages < 0 ||
      (has.pipeline_stages > 0 &&
       (has.pipeline_stage < 0 || has.pipeline_stage >= has.pipeline_stages ||
        has.pipeline_microbatches < 1 || !(has.pipeline_fwd_s >= 0) ||
        !(has.pipeline_bwd_s >= 0)))) {
    return InvalidArgumentError(fmt::format(
        "pipeline schedule (stages {}, stage {}, microbatches {}, fwd {} s, bwd {} s) needs "
        "0 <= stage < stages, microbatches >= 1 and non-negative times",
        has.pipeline_stages, has.pipeline_stage, has.pipeline_microbatches, has.pipeline_fwd_s,
        has.pipeline_bwd_s));
  }
  if (!(has.compute_max_rate >= 0)) {
    return InvalidArgumentError("has.compute_max_rate must be >= 0");
  }
  // Validates the job id the same way slots do.
  MEMENTO_RETURN_IF_ERROR(shm::ComputeSlotLayout(options.job_id, 0, {}, 1).status());
  return Status::Ok();
}

Result<ResolvedClientOptions> ResolveClientOptions(const ClientOptions& options) {
  ResolvedClientOptions r{options, options.agent_dir};
  if (const char* env = std::getenv("MEMENTO_PARITY_IN"); env != nullptr && *env) {
    if (std::string_view(env) == "agent") {
      r.options.client_parity = false;
    } else if (std::string_view(env) != "client") {
      return InvalidArgumentError(
          fmt::format("MEMENTO_PARITY_IN='{}' is not one of: client, agent", env));
    }
  }
  if (!options.copy_kernel.empty()) {
    MEMENTO_RETURN_IF_ERROR(snap::SelectCopyKernel(options.copy_kernel));
  } else if (const char* env = std::getenv("MEMENTO_COPY_KERNEL"); env != nullptr && *env) {
    // A performance setting of the whole job: a node whose CPU lacks the
    // kernel keeps its default rather than failing the job.
    if (Status st = snap::SelectCopyKernelUnlessChosen(env); !st.ok()) {
      MEMENTO_LOG_WARN("MEMENTO_COPY_KERNEL: {}; using {}", st.message(),
                       snap::ActiveCopyKernel().name);
    }
  }
  if (r.agent_dir.empty()) {
    const char* env = std::getenv("MEMENTO_RUN_DIR");
    r.agent_dir = env && *env ? env : shm::DefaultNodeRoot(options.job_id, options.node);
  }
  return r;
}

}  // namespace client

std::string_view CopyPriorityName(CopyPriority priority) {
  switch (priority) {
    case CopyPriority::kIdle:
      return "idle";
    case CopyPriority::kNormal:
      return "normal";
  }
  return "";
}

Result<CopyPriority> ParseCopyPriority(std::string_view name) {
  for (CopyPriority p : {CopyPriority::kIdle, CopyPriority::kNormal}) {
    if (name == CopyPriorityName(p)) return p;
  }
  return InvalidArgumentError(fmt::format("copy_priority '{}' is not one of: idle, normal", name));
}

std::string_view ScheduleName(Schedule schedule) {
  switch (schedule) {
    case Schedule::kAuto:
      return "auto";
    case Schedule::kEager:
      return "eager";
    case Schedule::kHas:
      return "has";
  }
  return "";
}

Result<Schedule> ParseSchedule(std::string_view name) {
  for (Schedule s : {Schedule::kAuto, Schedule::kEager, Schedule::kHas}) {
    if (name == ScheduleName(s)) return s;
  }
  return InvalidArgumentError(fmt::format("schedule '{}' is not one of: auto, eager, has", name));
}

}  // namespace memento
