// The launcher's reports and summary, as text and JSON (launch/launcher.h).
#include <cstdio>
#include <string>

#include "launch/launcher.h"

namespace memento::launch {

using nlohmann::json;

json RecoveryReport::ToJson() const {
  return {{"n", n},
          {"attempt", attempt},
          {"cause", cause},
          {"committed", committed},
          {"step", step},
          {"lost_nodes", lost_nodes},
          {"detect_s", detect_s},
          {"restart_s", restart_s},
          {"inventory_plan_s", inventory_plan_s},
          {"transfer_s", transfer_s},
          {"decode_s", decode_s},
          {"write_s", write_s},
          {"total_s", total_s},
          {"rebuilt_bytes", rebuilt_bytes},
          {"source", source},
          {"steps_lost", steps_lost},
          {"load_s", load_s},
          {"read_bytes", read_bytes},
          {"epoch", epoch},
          {"durable_skipped", durable_skipped},
          {"reason", reason},
          {"mode", mode},
          {"recovered_by", recovered_by},
          {"leader", leader},
          {"takeover", takeover},
          {"fallback", fallback},
          {"processes_restarted", processes_restarted},
          {"replaced_rank", replaced_rank},
          {"generation", generation},
          {"reached_step", reached_step},
          {"replayed_steps", replayed_steps},
          {"replayed_stages", replayed_stages},
          {"bytes_replayed", bytes_replayed},
          {"resume_s", resume_s}};
}

namespace {

// "; mode restart (fallback: ...), 8 process(es) restarted, resumed 1.234 s after the failure"
std::string ModeTail(const RecoveryReport& r) {
  std::string out = "; mode " + r.mode;
  if (!r.fallback.empty()) out += " (fallback: " + r.fallback + ")";
  out += ", " + std::to_string(r.processes_restarted) + " process(es) restarted";
  if (r.resume_s >= 0) {
    char b[64];
    std::snprintf(b, sizeof(b), ", resumed %.3f s after the failure", r.resume_s);
    out += b;
  }
  return out;
}

}  // namespace

std::string RecoveryReport::ToString() const {
  char buf[512];
  if (mode == "undo" || mode == "log") {
    if (step < 0) {
      return "recovery " + std::to_string(n) + " (" + mode + ", in process): rank " +
             std::to_string(replaced_rank) + " replaced, generation " + std::to_string(generation) +
             "; the job ended before every rank reported its recovery" + ModeTail(*this);
    }
    std::snprintf(buf, sizeof(buf),
                  "recovery %d (%s, in process): rank %d replaced (generation %d), survivors "
                  "kept; agreed step %lld (newest completed %lld), %lld step(s) lost, recovered "
                  "in %.3f s",
                  n, mode.c_str(), replaced_rank, generation, static_cast<long long>(step),
                  static_cast<long long>(reached_step), static_cast<long long>(steps_lost),
                  total_s);
    std::string out = buf;
    if (mode == "log") {
      out += "; " + std::to_string(replayed_stages) + " stage(s) replayed " +
             std::to_string(replayed_steps) + " step(s), " + std::to_string(bytes_replayed) +
             " logged bytes";
    }
    return out + ModeTail(*this);
  }
  if (step < 0 && source == "scratch") {
    std::snprintf(buf, sizeof(buf), "recovery %d: restarted from scratch in %.3f s (%s)", n,
                  total_s, reason.c_str());
    return buf + ModeTail(*this);
  }
  if (step < 0) {
    // Nothing was restored and the trainers were not restarted (exit 3).
    return "recovery " + std::to_string(n) + ": FAILED, nothing restored, the job ends (" + reason +
           ")";
  }
  if (source == "durable") {
    std::snprintf(buf, sizeof(buf),
                  "recovery %d: restored from the durable tier at step %lld, %lld steps lost "
                  "(committed %lld) in %.3f s: detect %.3f, restart %.3f, inventory+plan %.3f, "
                  "load %.3f s; %llu bytes read",
                  n, static_cast<long long>(step), static_cast<long long>(steps_lost),
                  static_cast<long long>(committed), total_s, detect_s, restart_s, inventory_plan_s,
                  load_s, static_cast<unsigned long long>(read_bytes));
    return buf + ModeTail(*this);
  }
  std::snprintf(buf, sizeof(buf),
                "recovery %d: restored step %lld (committed %lld) in %.3f s: detect %.3f, "
                "restart %.3f, inventory+plan %.3f, transfer %.3f, decode %.3f, write %.3f s; "
                "%llu bytes rebuilt",
                n, static_cast<long long>(step), static_cast<long long>(committed), total_s,
                detect_s, restart_s, inventory_plan_s, transfer_s, decode_s, write_s,
                static_cast<unsigned long long>(rebuilt_bytes));
  return buf + ModeTail(*this);
}

json StoreRestartReport::ToJson() const {
  return {{"n", n},
          {"cause", cause},
          {"recovery", recovery},
          {"reached_step", reached_step},
          {"committed_before", committed_before},
          {"down_s", down_s},
          {"republished_s", republished_s},
          {"resumed_s", resumed_s},
          {"resumed_step", resumed_step}};
}

std::string StoreRestartReport::ToString() const {
  auto after = [](double secs) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.3f s after", secs);
    return std::string(b);
  };
  char head[256];
  std::snprintf(head, sizeof(head), "store restart %d: %s at step %lld (committed %lld)", n,
                cause.c_str(), static_cast<long long>(reached_step),
                static_cast<long long>(committed_before));
  std::string out = head;
  if (recovery >= 0) out += " during recovery " + std::to_string(recovery);
  char down[64];
  std::snprintf(down, sizeof(down), "; down %.3f s", down_s);
  out += down;
  out += "; commit republished " + (republished_s >= 0 ? after(republished_s) : "never");
  out += "; commits resumed " +
         (resumed_s >= 0 ? after(resumed_s) + " (step " + std::to_string(resumed_step) + ")"
                         : std::string("never"));
  return out;
}

json LaunchSummary::ToJson() const {
  json r = json::array();
  for (const RecoveryReport& x : recoveries) r.push_back(x.ToJson());
  json sr = json::array();
  for (const StoreRestartReport& x : store_restarts) sr.push_back(x.ToJson());
  json mem = json::array();
  for (const NodeMemory& x : memory) mem.push_back(x.ToJson());
  return {{"success", success},          {"exit_code", exit_code},
          {"attempts", attempts},        {"committed", final_committed},
          {"commits", commits.ToJson()}, {"unprotected_steps", commits.unprotected_steps},
          {"failures", failures},        {"recoveries", r},
          {"store_restarts", sr},        {"memory", mem},
          {"message", message}};
}

std::string LaunchSummary::ToString() const {
  std::string s = "memento launch: " + std::string(success ? "job finished" : "job FAILED") +
                  " after " + std::to_string(attempts) + " attempt(s); newest committed step " +
                  std::to_string(final_committed) + "\n";
  if (!message.empty()) s += "  " + message + "\n";
  s += "  " + commits.ToString() + "\n";
  if (commits.unprotected_steps > 0) {
    s += "  WARNING: " + std::to_string(commits.unprotected_steps) +
         " step(s) ran UNPROTECTED: a node could not write their redundancy (" +
         commits.unprotected_reason +
         "); a node loss then had nothing in memory to rebuild from. Give the agents more "
         "memory (--agent-arg=--budget=..., a larger /dev/shm) or use --require-protection to "
         "fail instead\n";
  }
  s += "  failures: " + std::to_string(failures.size()) + "\n";
  for (const std::string& f : failures) s += "    - " + f + "\n";
  s += "  recoveries: " + std::to_string(recoveries.size()) + "\n";
  for (const RecoveryReport& r : recoveries) s += "    - " + r.ToString() + "\n";
  if (!store_restarts.empty()) {
    s += "  store restarts: " + std::to_string(store_restarts.size()) + "\n";
    for (const StoreRestartReport& r : store_restarts) s += "    - " + r.ToString() + "\n";
  }
  if (!memory.empty()) {
    s += "  host memory per node (one version; plan = REFT's bytes for the policy):\n";
    for (const NodeMemory& m : memory) s += "    - " + m.ToString() + "\n";
  }
  return s;
}

}  // namespace memento::launch
