// memento-trainer --launch (local_launch.cc).
#pragma once

#include <string>

namespace memento::trainer {

// Starts one child per rank (this binary, the same flags, plus --rank and
// --rendezvous) and waits for all; on a failure stops, restarts or replaces
// ranks as `recovery` says (none | restart | undo | log), at most
// `max_recoveries` times. The process exit status.
int LaunchLocal(int argc, char** argv, int world, const std::string& rendezvous,
                const std::string& recovery, int max_recoveries);

}  // namespace memento::trainer
