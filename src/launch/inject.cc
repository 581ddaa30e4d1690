#include "launch/inject.h"

#include <charconv>

namespace memento::launch {

std::string_view InjectKindName(InjectKind kind) {
  switch (kind) {
    case InjectKind::kKillRank:
      return "kill-rank";
    case InjectKind::kKillAgent:
      return "kill-agent";
    case InjectKind::kKillNode:
      return "kill-node";
    case InjectKind::kCorruptRank:
      return "corrupt-rank";
    case InjectKind::kKillStore:
      return "kill-store";
    case InjectKind::kCorruptDurable:
      return "corrupt-durable";
  }
  return "?";
}

std::string Injection::ToString() const {
  if (kind == InjectKind::kCorruptDurable) {
    return std::string(InjectKindName(kind)) + "@step=" + std::to_string(step);
  }
  if (kind == InjectKind::kKillStore) {
    return std::string(InjectKindName(kind)) + (recovery >= 0
                                                    ? "@recovery=" + std::to_string(recovery)
                                                    : "@step=" + std::to_string(step));
  }
  return std::string(InjectKindName(kind)) + ":" +
         (target == kLeader ? std::string("leader") : std::to_string(target)) +
         (recovery < 0      ? "@step=" + std::to_string(step)
          : in_transfer     ? "@transfer=" + std::to_string(recovery)
          : in_durable_load ? "@durable=" + std::to_string(recovery)
                            : "@recovery=" + std::to_string(recovery));
}

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

template <typename T>
bool ParseNumber(std::string_view s, T* out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

Result<Injection> ParseOne(std::string_view entry, int world_size, int num_nodes) {
  const std::string quoted = "'" + std::string(entry) + "'";
  const std::string form =
      " (expected kill-rank:R@step=N, kill-agent:I@step=N, kill-node:I@step=N, "
      "corrupt-rank:R@step=N, corrupt-durable@step=N, kill-store@step=N; "
      "kill-agent, kill-node and kill-store also @recovery=K; kill-agent and kill-node also "
      "@transfer=K and @durable=K)";
  size_t at = entry.find('@');
  if (at != std::string_view::npos && entry.substr(0, at) == "corrupt-durable") {
    // The durable tier has no target: corrupt-durable@step=N.
    Injection inj;
    inj.kind = InjectKind::kCorruptDurable;
    std::string_view when = entry.substr(at + 1);
    if (when.substr(0, 5) != "step=") {
      return InvalidArgumentError("injection " + quoted +
                                  ": expected '@step=N' after corrupt-durable");
    }
    if (!ParseNumber(when.substr(5), &inj.step) || inj.step < 0) {
      return InvalidArgumentError("injection " + quoted + ": step '" + std::string(when.substr(5)) +
                                  "' is not a non-negative integer");
    }
    return inj;
  }
  if (at != std::string_view::npos && entry.substr(0, at) == "kill-store") {
    // The store has no target: kill-store@step=N or kill-store@recovery=K.
    Injection inj;
    inj.kind = InjectKind::kKillStore;
    std::string_view when = entry.substr(at + 1);
    if (when.substr(0, 5) == "step=") {
      if (!ParseNumber(when.substr(5), &inj.step) || inj.step < 0) {
        return InvalidArgumentError("injection " + quoted + ": step '" +
                                    std::string(when.substr(5)) +
                                    "' is not a non-negative integer");
      }
    } else if (when.substr(0, 9) == "recovery=") {
      if (!ParseNumber(when.substr(9), &inj.recovery) || inj.recovery < 0) {
        return InvalidArgumentError("injection " + quoted + ": recovery '" +
                                    std::string(when.substr(9)) +
                                    "' is not a non-negative integer");
      }
    } else {
      return InvalidArgumentError("injection " + quoted +
                                  ": expected '@step=N' or '@recovery=K' after kill-store");
    }
    return inj;
  }
  size_t colon = entry.find(':');
  if (colon == std::string_view::npos || at == std::string_view::npos || at < colon) {
    return InvalidArgumentError("injection " + quoted + form);
  }
  std::string_view kind = entry.substr(0, colon);
  std::string_view target = entry.substr(colon + 1, at - colon - 1);
  std::string_view when = entry.substr(at + 1);
  Injection inj;
  if (kind == "kill-rank") {
    inj.kind = InjectKind::kKillRank;
  } else if (kind == "kill-agent") {
    inj.kind = InjectKind::kKillAgent;
  } else if (kind == "kill-node") {
    inj.kind = InjectKind::kKillNode;
  } else if (kind == "corrupt-rank") {
    inj.kind = InjectKind::kCorruptRank;
  } else if (kind == "kill-store" || kind == "corrupt-durable") {
    return InvalidArgumentError("injection " + quoted + ": " + std::string(kind) +
                                " takes no target (" + std::string(kind) + "@step=N)");
  } else {
    return InvalidArgumentError("injection " + quoted + ": unknown kind '" + std::string(kind) +
                                "'" + form);
  }
  const bool rank = inj.kind == InjectKind::kKillRank || inj.kind == InjectKind::kCorruptRank;
  if (target == "leader") {
    if (rank || when.substr(0, 9) != "recovery=") {
      return InvalidArgumentError("injection " + quoted +
                                  ": target 'leader' is only for kill-agent and kill-node "
                                  "during a recovery (kill-agent:leader@recovery=K)");
    }
    inj.target = Injection::kLeader;
  } else if (!ParseNumber(target, &inj.target) || inj.target < 0) {
    return InvalidArgumentError("injection " + quoted + ": target '" + std::string(target) +
                                "' is not a non-negative integer");
  }
  const int limit = rank ? world_size : num_nodes;
  if (inj.target >= limit) {
    return InvalidArgumentError("injection " + quoted + ": " + (rank ? "rank " : "node ") +
                                std::to_string(inj.target) + " does not exist (the job has " +
                                std::to_string(limit) + (rank ? " ranks)" : " nodes)"));
  }
  const bool in_recovery = when.substr(0, 9) == "recovery=";
  const bool in_transfer = when.substr(0, 9) == "transfer=";
  const bool in_durable_load = when.substr(0, 8) == "durable=";
  if (in_recovery || in_transfer || in_durable_load) {
    if (inj.kind == InjectKind::kKillRank || inj.kind == InjectKind::kCorruptRank) {
      return InvalidArgumentError("injection " + quoted + ": " +
                                  std::string(InjectKindName(inj.kind)) +
                                  " takes only '@step=N' (no trainer runs during a recovery)");
    }
    const std::string_view number = when.substr(in_durable_load ? 8 : 9);
    if (!ParseNumber(number, &inj.recovery) || inj.recovery < 0) {
      return InvalidArgumentError("injection " + quoted + ": " +
                                  (in_transfer       ? "transfer"
                                   : in_durable_load ? "durable"
                                                     : "recovery") +
                                  " '" + std::string(number) + "' is not a non-negative integer");
    }
    inj.in_transfer = in_transfer;
    inj.in_durable_load = in_durable_load;
    return inj;
  }
  if (when.substr(0, 5) != "step=") {
    return InvalidArgumentError("injection " + quoted + ": expected '@step=N' after the target");
  }
  if (!ParseNumber(when.substr(5), &inj.step) || inj.step < 0) {
    return InvalidArgumentError("injection " + quoted + ": step '" + std::string(when.substr(5)) +
                                "' is not a non-negative integer");
  }
  return inj;
}

}  // namespace

Result<std::vector<Injection>> ParseInjections(std::string_view text, int world_size,
                                               int num_nodes) {
  std::vector<Injection> out;
  text = Trim(text);
  if (text.empty()) return out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view entry = Trim(text.substr(start, end - start));
    if (entry.empty()) {
      return InvalidArgumentError("injection list '" + std::string(text) + "' has an empty entry");
    }
    MEMENTO_ASSIGN_OR_RETURN(Injection inj, ParseOne(entry, world_size, num_nodes));
    out.push_back(inj);
    start = end + 1;
  }
  return out;
}

}  // namespace memento::launch
