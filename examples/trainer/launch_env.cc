#include "launch_env.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace memento::trainer {
namespace {

// Parses a decimal integer >= min; InvalidArgument naming the variable otherwise.
Result<int> ParseInt(const char* name, const char* value, int min) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (*value == '\0' || end == nullptr || *end != '\0' || errno != 0 || v < min || v > 1 << 24) {
    return InvalidArgumentError(std::string(name) + "='" + value +
                                "' is not an integer >= " + std::to_string(min));
  }
  return static_cast<int>(v);
}

// "3", "n3", "node3": the trailing number.
Result<int> ParseNode(const char* value) {
  std::string s(value);
  size_t i = s.size();
  while (i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1]))) --i;
  if (i == s.size()) {
    return InvalidArgumentError(std::string("MEMENTO_NODE='") + value +
                                "' does not end in a node number (expected 3, n3 or node3)");
  }
  return ParseInt("MEMENTO_NODE", s.c_str() + i, 0);
}

// The first variable of `names` that is set, or nullptr.
const char* First(const EnvLookup& env, std::initializer_list<const char*> names,
                  const char** which) {
  for (const char* n : names) {
    if (const char* v = env(n); v != nullptr) {
      *which = n;
      return v;
    }
  }
  return nullptr;
}

Status SetInt(const EnvLookup& env, bool given, std::initializer_list<const char*> names, int min,
              int* out) {
  if (given) return Status::Ok();
  const char* which = nullptr;
  const char* v = First(env, names, &which);
  if (v == nullptr) return Status::Ok();
  MEMENTO_ASSIGN_OR_RETURN(*out, ParseInt(which, v, min));
  return Status::Ok();
}

}  // namespace

Status ApplyLauncherEnv(const EnvLookup& env, const GivenFlags& given, TrainerOptions* options,
                        int* world, MementoTarget* memento) {
  CommOptions& c = options->comm;
  MEMENTO_RETURN_IF_ERROR(SetInt(env, given.rank, {"MEMENTO_RANK", "RANK"}, 0, &c.rank));
  MEMENTO_RETURN_IF_ERROR(SetInt(env, given.world, {"MEMENTO_WORLD_SIZE", "WORLD_SIZE"}, 1, world));
  MEMENTO_RETURN_IF_ERROR(SetInt(env, given.dp, {"MEMENTO_DP"}, 1, &c.topology.dp));
  MEMENTO_RETURN_IF_ERROR(SetInt(env, given.tp, {"MEMENTO_TP"}, 1, &c.topology.tp));
  MEMENTO_RETURN_IF_ERROR(SetInt(env, given.pp, {"MEMENTO_PP"}, 1, &c.topology.pp));
  const char* which = nullptr;
  if (!given.rendezvous) {
    if (const char* v = First(env, {"MEMENTO_RENDEZVOUS", "MEMENTO_TRAINER_RENDEZVOUS"}, &which)) {
      c.rendezvous_dir = v;
    }
  }
  if (!given.run_id) {
    if (const char* v = env("MEMENTO_TRAINER_RUN_ID")) {
      c.run_id = v;
    } else if (const char* a = env("MEMENTO_ATTEMPT")) {
      // The launcher's rendezvous directory is fresh per attempt already; the
      // attempt in the run id also keeps a reused directory safe.
      MEMENTO_ASSIGN_OR_RETURN(int attempt, ParseInt("MEMENTO_ATTEMPT", a, 0));
      c.run_id = "a" + std::to_string(attempt);
    }
  }
  if (!given.job_id) {
    if (const char* v = env("MEMENTO_JOB")) memento->job_id = v;
  }
  if (!given.agent_dir) {
    if (const char* v = env("MEMENTO_RUN_DIR")) memento->agent_dir = v;
  }
  if (!given.node) {
    if (const char* v = env("MEMENTO_NODE")) {
      MEMENTO_ASSIGN_OR_RETURN(memento->node, ParseNode(v));
    }
  }
  const bool launched = env("MEMENTO_JOB") != nullptr && env("MEMENTO_RUN_DIR") != nullptr;
  memento->enabled = !given.no_memento && (given.memento || launched);
  return Status::Ok();
}

}  // namespace memento::trainer
