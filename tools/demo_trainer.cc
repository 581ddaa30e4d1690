// The single-node demo's trainer (`memento demo --trainer`, tools/demo.h): a
// deterministic model (toy::AdamState: parameters and two optimizer moments
// rewritten every step) that snapshots every step and reports its progress
// on a file (src/toy/progress.h), through the toy trainers' core
// (src/toy/toy_run.h).
#include <string>

#include "common/log.h"
#include "memento/client.h"
#include "tools/command.h"
#include "tools/demo.h"
#include "tools/environment.h"
#include "toy/toy_run.h"

namespace memento::tools {

int RunDemoTrainer(const DemoArgs& a) {
  InitLogging("trainer rank0", LogOptionsFromEnvironment());
  toy::ProgressLog log("memento demo --trainer");
  if (Status st = log.Open(a.progress); !st.ok()) return ReportStatus(st);
  toy::AdamState state(a.mib << 20);
  ClientOptions o;
  o.job_id = "demo";
  o.agent_dir = a.root;
  o.copy_threads = a.threads;
  auto client = Client::Connect(o);
  if (!client.ok()) log.Exit(client.status());
  auto start = toy::RegisterSealRestore(**client, state);
  if (!start.ok()) log.Exit(start.status());
  toy::ReportStart(log, *start, state, toy::FreshStart::kNLine);
  toy::StepLoopOptions loop;
  loop.steps = a.steps;
  if (Status st = toy::RunSteps(client->get(), state, log, loop); !st.ok()) log.Exit(st);
  return 0;
}

}  // namespace memento::tools
