// `memento recover`: the agents' own recovery for operators (docs/recovery.md,
// "Recovery run by the agents"): the leader, the last recovery's status, and
// a manual trigger. The agents must run with --recovery-leader request|auto.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "coord/store.h"
#include "fmt/format.h"
#include "launch/recovery_leader.h"
#include "tools/command.h"
#include "tools/json_output.h"

namespace memento::tools {
namespace {

struct RecoverArgs {
  std::string store_url;
  std::string job;
  std::string token_file;
  bool trigger = false;
  bool wait = false;
  bool json = false;
  double timeout_s = 300;
};

void Print(const launch::RecoveryView& v, bool json) {
  if (json) {
    nlohmann::json j = {{"leader", v.leader}, {"requested", v.requested}};
    j["status"] = v.has_status ? v.status.ToJson() : nlohmann::json();
    PrintJson("memento.recover/1", std::move(j));
    return;
  }
  std::printf("leader: %s\n", v.leader.empty() ? "(none elected: no agent runs with "
                                                 "--recovery-leader request|auto)"
                                               : v.leader.c_str());
  std::printf("requested: %lld\n", static_cast<long long>(v.requested));
  if (!v.has_status) {
    std::printf("last recovery: none\n");
    return;
  }
  const launch::RecoveryStatus& s = v.status;
  std::printf("last recovery: %lld %s (leader %s, trigger %s%s)\n", static_cast<long long>(s.id),
              s.state.c_str(), s.leader.c_str(), s.trigger.c_str(),
              s.takeover ? ", taken over from a leader that stopped" : "");
  if (s.restore_step >= 0) {
    std::printf("restore step: %lld (from %s)\n", static_cast<long long>(s.restore_step),
                s.source.c_str());
  }
  if (!s.message.empty()) std::printf("message: %s\n", s.message.c_str());
  if (s.recovery.is_object() && s.recovery.contains("total_s")) {
    std::printf(
        "breakdown: inventory+plan %.3fs, transfer %.3fs, decode %.3fs, write %.3fs, "
        "total %.3fs, %s bytes rebuilt\n",
        s.recovery.value("inventory_plan_s", 0.0), s.recovery.value("transfer_s", 0.0),
        s.recovery.value("decode_s", 0.0), s.recovery.value("write_s", 0.0),
        s.recovery.value("total_s", 0.0),
        std::to_string(s.recovery.value("rebuilt_bytes", uint64_t{0})).c_str());
  }
}

int RunRecover(const RecoverArgs& a) {
  auto store = coord::OpenStore(a.store_url, a.token_file, Deadline::AfterSeconds(30));
  if (!store.ok()) return ReportStatus(store.status());
  int64_t want = 0;
  if (a.trigger) {
    auto id = launch::RequestRecovery(**store, a.job, Deadline::AfterSeconds(10));
    if (!id.ok()) return ReportStatus(id.status());
    want = *id;
    if (!a.json) std::printf("requested recovery %lld\n", static_cast<long long>(want));
  }
  auto view = launch::ReadRecoveryView(**store, a.job, Deadline::AfterSeconds(10));
  if (!view.ok()) return ReportStatus(view.status());
  if (a.wait) {
    if (want == 0) want = view->requested;
    if (want == 0) {
      return ReportStatus(FailedPreconditionError(
          fmt::format("job '{}' has no recovery to wait for (none requested)", a.job)));
    }
    const Deadline d = Deadline::AfterSeconds(a.timeout_s);
    while (!(view->has_status && view->status.id >= want && view->status.final())) {
      if (d.expired()) {
        Print(*view, a.json);
        return ReportStatus(DeadlineExceededError(fmt::format(
            "recovery {} of job '{}' did not finish within {} s{}", want, a.job, a.timeout_s,
            view->leader.empty() ? " (no recovery leader is elected)" : "")));
      }
      usleep(200000);
      view = launch::ReadRecoveryView(**store, a.job, Deadline::AfterSeconds(10));
      if (!view.ok()) return ReportStatus(view.status());
    }
  }
  Print(*view, a.json);
  if (a.wait && view->status.state == "failed") return 1;
  return 0;
}

void Setup(CLI::App& app, CommandContext& ctx) {
  static RecoverArgs args;
  auto* cmd = app.add_subcommand(
      "recover",
      "Recovery run by the agents: show the leader and the last recovery, or ask for one "
      "(the agents must run with --recovery-leader request|auto; docs/recovery.md)");
  cmd->add_option("--store", args.store_url, "Coordination store (tcp://... or etcd://...)")
      ->required();
  cmd->add_option("--job", args.job, "The job")->required();
  cmd->add_option("--token-file", args.token_file,
                  "Job token file (mode 0600); default: $MEMENTO_JOB_TOKEN");
  cmd->add_flag("--trigger", args.trigger,
                "Ask the recovery leader for a recovery now: every agent rebuilds what it lacks "
                "of the newest committed step and serves it as the restore target (the "
                "trainers go back to it when they restart)");
  cmd->add_flag("--wait", args.wait,
                "Wait until the requested recovery (or the newest one) is done or failed; exit "
                "1 when it failed");
  cmd->add_option("--timeout", args.timeout_s, "Seconds --wait waits")->default_val(300);
  cmd->add_flag("--json", args.json, "Print JSON");
  cmd->footer(kExitCodesFooter);
  cmd->callback([&ctx] { ctx.exit_code = RunRecover(args); });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_COMMAND(recover, memento::tools::Setup);
