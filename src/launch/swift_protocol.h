// In-process (SWIFT) recovery between a launcher and its trainer ranks
// (docs/swift.md): the one protocol that both `memento-trainer --launch` and
// `memento launch --recovery undo|log|auto` speak, through files in the job's
// rendezvous directory (the directory the ranks' Gloo FileStore uses):
//
//   swift.generation        the launcher announces generation g (> 0) after
//                           a rank died and its replacement was started; a
//                           survivor whose step failed polls it, then
//                           reconnects under run id "<run id>-g<g>"
//   swift.recovered.g<g>.rank<r>   written by rank r when its recovery to
//                           generation g succeeded: {"rank", "mode",
//                           "replacement", "from_step", "step", "wall_s"}
//   swift.resumed.g<g>      written by the first rank that completed a step
//                           after the recovery of generation g (or after a
//                           whole-job restart, g = 0 of the new attempt):
//                           {"rank", "step", "wall_s"}
//
// A rank whose in-process recovery fails exits kExitRecoveryFailed; the
// launcher then falls back to restarting the whole job. Under `memento
// launch` the replacement learns its generation and role from the
// environment (kEnvGeneration, kEnvReplace), the mode from kEnvRecovery.
//
// Header-only (the trainer example does not link the launcher). Writers
// replace files atomically (write + rename); all times are CLOCK_REALTIME
// seconds, comparable across the processes of one machine.
#pragma once

#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "memento/status.h"

namespace memento::launch::swift {

// Exit status of a rank whose in-process recovery failed (EX_TEMPFAIL).
inline constexpr int kExitRecoveryFailed = 75;

inline constexpr const char* kEnvRecovery = "MEMENTO_RECOVERY";            // "undo" or "log"
inline constexpr const char* kEnvGeneration = "MEMENTO_SWIFT_GENERATION";  // g
inline constexpr const char* kEnvReplace = "MEMENTO_SWIFT_REPLACE";        // "1"

inline double WallSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

inline std::string GenerationPath(const std::string& rendezvous) {
  return rendezvous + "/swift.generation";
}
inline std::string RecoveredPath(const std::string& rendezvous, int generation, int rank) {
  return rendezvous + "/swift.recovered.g" + std::to_string(generation) + ".rank" +
         std::to_string(rank);
}
inline std::string ResumedPath(const std::string& rendezvous, int generation) {
  return rendezvous + "/swift.resumed.g" + std::to_string(generation);
}

// Writes `text` to `path` atomically (a unique temporary name, then rename).
inline Status WriteFileAtomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return ErrnoError("open " + tmp, errno);
  const bool ok = std::fputs(text.c_str(), f) >= 0;
  if (std::fclose(f) != 0 || !ok) return ErrnoError("write " + tmp, errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename " + tmp, errno);
  return Status::Ok();
}

// The whole file; empty when it does not exist (yet).
inline std::string ReadFileOrEmpty(const std::string& path) {
  std::string out;
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

inline Status WriteGeneration(const std::string& rendezvous, int generation) {
  return WriteFileAtomic(GenerationPath(rendezvous), std::to_string(generation) + "\n");
}

// The announced generation; 0 when none was announced.
inline int ReadGeneration(const std::string& rendezvous) {
  const std::string s = ReadFileOrEmpty(GenerationPath(rendezvous));
  int g = 0;
  if (std::sscanf(s.c_str(), "%d", &g) != 1) g = 0;
  return g;
}

}  // namespace memento::launch::swift
