// The rank's files for memento-trainer's main: --save/--load paths per rank,
// the --digest-file digest, stale pipeline-log spool files, and a restarted
// job's agreement on the newest step every rank saved. Moved out of main.cc
// unchanged.
#include "rank_files.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/clock.h"
#include "launch/swift_protocol.h"

namespace memento::trainer {

std::string RankPath(const std::string& path, int rank) {
  const std::string key = "{rank}";
  std::string out = path;
  size_t pos = out.find(key);
  if (pos == std::string::npos) return out + ".rank" + std::to_string(rank);
  return out.replace(pos, key.size(), std::to_string(rank));
}

// Writes {"rank","step","state_xxh3","params_xxh3"} to `path` (atomic
// replace), for bit-identity checks across runs (`memento demo`).
Status WriteDigest(Trainer& trainer, const std::string& path) {
  const uint64_t params = Checksum(trainer.params(), trainer.padded_params() * sizeof(float));
  char line[256];
  std::snprintf(line, sizeof(line),
                "{\"rank\": %d, \"step\": %" PRId64 ", \"state_xxh3\": \"%016" PRIx64
                "\", \"params_xxh3\": \"%016" PRIx64 "\"}\n",
                trainer.rank(), trainer.state().step, trainer.StateChecksum(), params);
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return ErrnoError("open " + tmp, errno);
  const bool ok = std::fputs(line, f) >= 0;
  if (std::fclose(f) != 0 || !ok) return ErrnoError("write " + tmp, errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename " + tmp, errno);
  return Status::Ok();
}

// Removes rank `rank`'s pipeline log spool files of steps after `step` in
// `dir` (an earlier attempt's, beyond the step this one starts from);
// returns how many.
int RemoveSpoolFilesAfter(const std::string& dir, int rank, int64_t step) {
  const std::string prefix =
      std::filesystem::path(PipelineLogSpool::BasePath(dir, rank)).filename().string() + ".step";
  int removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string tail = name.substr(prefix.size());
    if (tail.empty() || tail.find_first_not_of("0123456789") != std::string::npos) continue;
    if (std::stoll(tail) > step && std::filesystem::remove(e.path(), ec)) ++removed;
  }
  return removed;
}

// A restarted job's ranks agree on where to start, every rank taking part
// in the same collectives whatever it finds (a rank that skipped one would
// leave the others waiting in it until the timeout): the newest step every
// rank saved. A rank killed between its step s and its save of s (or by the
// launcher's stop while it was still saving) has s - K, or no save at all
// if s was the first; the others saved s and keep s - K as PATH.prev. With
// no common save the job starts where it first started: `first_load` (the
// rank's --load), or the initial state.
Status ResumeFromSaves(Trainer& trainer, const std::string& path, const std::string& first_load) {
  int64_t mine = 0;  // no save yet
  Status read = Status::Ok();
  if (access(path.c_str(), F_OK) == 0) {
    auto step = trainer.SavedStep(path);
    read = step.status();
    mine = step.ok() ? *step : -1;  // -1: every rank learns that one is unreadable
  }
  double newest = static_cast<double>(mine);
  MEMENTO_RETURN_IF_ERROR(trainer.comm().AllreduceWorldMin(&newest, 1));
  if (!read.ok()) return read.WithContext("this rank's saved state");
  if (newest < 0) return FailedPreconditionError("another rank's saved state is unreadable");
  const int64_t agreed = static_cast<int64_t>(newest);
  Status st = Status::Ok();
  if (agreed == 0) {
    if (!first_load.empty()) st = trainer.Load(first_load);
  } else if (mine == agreed) {
    st = trainer.Load(path);
  } else {
    const std::string prev = path + ".prev";
    auto prev_step = trainer.SavedStep(prev);
    if (prev_step.ok() && *prev_step != agreed) {
      st = FailedPreconditionError(prev + " holds step " + std::to_string(*prev_step) +
                                   ", not the newest step every rank saved (" +
                                   std::to_string(agreed) + ")");
    } else {
      st = prev_step.ok() ? trainer.Load(prev) : prev_step.status();
    }
  }
  // Every rank learns whether all could load it (no one trains on alone).
  double ok = st.ok() ? 1.0 : 0.0;
  MEMENTO_RETURN_IF_ERROR(trainer.comm().AllreduceWorldMin(&ok, 1));
  if (!st.ok()) return st.WithContext("resuming from step " + std::to_string(agreed));
  if (ok < 1.0) {
    return FailedPreconditionError("another rank could not load step " + std::to_string(agreed));
  }
  if (agreed != mine) {
    std::fprintf(stderr,
                 "memento-trainer rank %d: resuming from step %" PRId64
                 " (the newest step every rank saved; this rank's newest: %" PRId64 ")\n",
                 trainer.rank(), agreed, mine);
  }
  return Status::Ok();
}

}  // namespace memento::trainer
