// memento-trainer's fault injection on files (--fail-point save,
// --corrupt-log-rank). Moved out of main.cc unchanged.
#include "fault_injection.h"

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

// Fault injection (--fail-point save): the step of any rank's save file
// (its TrainState is the file's last bytes), or -1.
int64_t SavedStepOfFile(const std::string& path) {
  TrainState state;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return -1;
  const bool ok = std::fseek(f, -static_cast<long>(sizeof(state)), SEEK_END) == 0 &&
                  std::fread(&state, sizeof(state), 1, f) == 1;
  std::fclose(f);
  return ok && state.magic == TrainState::kMagic ? state.step : -1;
}

// Fault injection (--corrupt-log-rank): flips one byte in the middle of the
// log file at `path` (a rank's log, or its newest spool step file).
Status CorruptNewestLogFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r+b");
  if (f == nullptr) return ErrnoError("open " + path, errno);
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  const long at = size / 2;
  int c = EOF;
  if (size > 0 && std::fseek(f, at, SEEK_SET) == 0) c = std::fgetc(f);
  bool ok = c != EOF && std::fseek(f, at, SEEK_SET) == 0 && std::fputc(c ^ 0x20, f) != EOF;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) return DataLossError("cannot flip a byte of " + path);
  std::fprintf(stderr, "memento-trainer: fault injection: flipped byte %ld of %s\n", at,
               path.c_str());
  return Status::Ok();
}

}  // namespace memento::trainer
