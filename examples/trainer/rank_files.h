// The rank's files for memento-trainer's main (rank_files.cc).
#pragma once

#include <cstdint>
#include <string>

#include "memento/status.h"
#include "trainer.h"

namespace memento::trainer {

// PATH with {rank} replaced by `rank`, or PATH.rank<k> when it has none.
std::string RankPath(const std::string& path, int rank);

// Writes {"rank","step","state_xxh3","params_xxh3"} to `path` (atomic
// replace), for bit-identity checks across runs (`memento demo`).
Status WriteDigest(Trainer& trainer, const std::string& path);

// Removes rank `rank`'s pipeline log spool files of steps after `step` in
// `dir`; returns how many.
int RemoveSpoolFilesAfter(const std::string& dir, int rank, int64_t step);

// A restarted job's ranks agree on the newest step every rank saved and
// load it (`path`, its .prev, or `first_load` / the initial state when
// there is none); collective over the world.
Status ResumeFromSaves(Trainer& trainer, const std::string& path, const std::string& first_load);

}  // namespace memento::trainer
