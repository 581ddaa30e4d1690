// `memento bench store [--etcd URL] [--nodes 1000] [--ops 200] [--rounds 3] --json`:
// the coordination store's latency and a commit round, for the embedded store
// (EmbeddedStoreServer in this process, reached over loopback TCP) and for a
// real etcd in the same run (docs/etcd.md, "Measurements"):
//
//   put_ms               median latency of one Set (100-byte value)
//   get_ms               median latency of one Get
//   watch_ms             median time from a Set's start until a WatchPoll
//                        waiting on another client returns its event
//   commit_round_1000_s  --nodes simulated nodes each report COMPLETED(step)
//                        (from 32 threads) while a CommitCoordinator runs the
//                        commit rule; the time until commit/latest shows the
//                        step to a third client (median of --rounds rounds)
//
// Without --etcd an etcd is started on loopback with a temporary data
// directory (coord::EtcdProcess); without an etcd binary the "etcd" entry
// holds {"error": ...}.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/mutex.h"
#include "coord/commit.h"
#include "coord/embedded_store.h"
#include "coord/etcd_process.h"
#include "coord/keys.h"
#include "coord/store.h"
#include "net/job_token.h"
#include "tools/command.h"
#include "tools/environment.h"
#include "tools/json_output.h"

namespace memento::tools {
namespace {

struct Args {
  std::string etcd_url;
  std::string etcd_dir;
  int nodes = 1000;
  int ops = 200;
  int rounds = 3;
  int threads = 32;
  bool json = true;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1));
  return v[i];
}

// Opens one more client of the store under test.
using Opener = std::function<Result<std::unique_ptr<coord::Store>>()>;

Result<nlohmann::json> Measure(const Opener& open, const Args& a, const std::string& name) {
  const Deadline d = Deadline::AfterSeconds(120);
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<coord::Store> store, open());
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<coord::Store> watcher_store, open());
  const std::string prefix = "/memento-bench/" + name + "/" + std::to_string(getpid()) + "/";
  const std::string value(100, 'v');
  // Warm-up (connections, etcd's first writes).
  for (int i = 0; i < 10; ++i) {
    MEMENTO_RETURN_IF_ERROR(store->Set(prefix + "warm", value, d).status());
  }
  std::vector<double> put_ms, get_ms, watch_ms;
  for (int i = 0; i < a.ops; ++i) {
    Stopwatch sw;
    MEMENTO_RETURN_IF_ERROR(store->Set(prefix + "k" + std::to_string(i), value, d).status());
    put_ms.push_back(sw.Seconds() * 1e3);
  }
  for (int i = 0; i < a.ops; ++i) {
    Stopwatch sw;
    MEMENTO_RETURN_IF_ERROR(store->Get(prefix + "k" + std::to_string(i), d).status());
    get_ms.push_back(sw.Seconds() * 1e3);
  }
  // Watch latency: a poller waits on another client; each Set starts a clock.
  {
    const std::string wprefix = prefix + "watch/";
    MEMENTO_ASSIGN_OR_RETURN(coord::ListResult start, watcher_store->List(wprefix, d));
    std::atomic<int> seen{0};
    std::atomic<bool> failed{false};
    Mutex mu;
    std::vector<TimePoint> received(static_cast<size_t>(a.ops));
    std::thread poller([&] {
      int64_t after = start.revision;
      while (seen.load() < a.ops && !d.expired()) {
        auto b = watcher_store->WatchPoll(wprefix, after, Deadline::AfterSeconds(1));
        if (!b.ok()) {
          if (b.status().code() == StatusCode::kDeadlineExceeded) continue;
          failed.store(true);
          return;
        }
        const TimePoint now = Now();
        for (const auto& ev : b->events) {
          int i = std::stoi(ev.kv.value);
          if (i >= 0 && i < a.ops) received[static_cast<size_t>(i)] = now;
          seen.fetch_add(1);
        }
        after = b->revision;
      }
    });
    for (int i = 0; i < a.ops && !failed.load(); ++i) {
      const TimePoint sent = Now();
      MEMENTO_RETURN_IF_ERROR(store->Set(wprefix + "k", std::to_string(i), d).status());
      while (seen.load() <= i && !failed.load() && !d.expired()) std::this_thread::yield();
      watch_ms.push_back(SecondsBetween(sent, received[static_cast<size_t>(i)]) * 1e3);
    }
    poller.join();
    if (failed.load()) return InternalError(name + ": the watch poller failed");
  }
  // Commit rounds of `nodes` simulated nodes.
  const std::string job = "bench-" + name + "-" + std::to_string(getpid());
  std::set<std::string> members;
  std::vector<std::string> node_names;
  for (int n = 0; n < a.nodes; ++n) {
    node_names.push_back(coord::NodeName(n));
    members.insert(node_names.back());
  }
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<coord::Store> coordinator_store, open());
  MEMENTO_ASSIGN_OR_RETURN(
      auto coordinator, coord::CommitCoordinator::Start(coordinator_store.get(), job, members, d));
  std::vector<double> round_s;
  const std::string latest = coord::JobKeys(job).CommitLatest();
  for (int r = 0; r < a.rounds; ++r) {
    const int64_t step = r + 1;
    MEMENTO_ASSIGN_OR_RETURN(coord::ListResult before, watcher_store->List(latest, d));
    Stopwatch sw;
    std::atomic<int> next{0};
    std::atomic<bool> report_failed{false};
    std::vector<std::thread> reporters;
    for (int t = 0; t < a.threads; ++t) {
      reporters.emplace_back([&] {
        for (int n; (n = next.fetch_add(1)) < a.nodes;) {
          if (!coord::ReportCompleted(*store, job, node_names[static_cast<size_t>(n)], step, d)
                   .ok()) {
            report_failed.store(true);
          }
        }
      });
    }
    // Wait for commit/latest to show the step (from a third client).
    int64_t after = before.revision;
    bool committed = false;
    while (!committed && !d.expired()) {
      auto b = watcher_store->WatchPoll(latest, after, Deadline::AfterSeconds(1));
      if (!b.ok()) {
        if (b.status().code() == StatusCode::kDeadlineExceeded) continue;
        for (auto& t : reporters) t.join();
        return b.status().WithContext(name + ": watching commit/latest");
      }
      for (const auto& ev : b->events) {
        if (ev.kv.value == std::to_string(step)) committed = true;
      }
      after = b->revision;
    }
    const double s = sw.Seconds();
    for (auto& t : reporters) t.join();
    if (report_failed.load()) return InternalError(name + ": a COMPLETED report failed");
    if (!committed) return DeadlineExceededError(name + ": the commit round did not finish");
    round_s.push_back(s);
  }
  coordinator.reset();
  nlohmann::json j;
  j["put_ms"] = Median(put_ms);
  j["put_p99_ms"] = Percentile(put_ms, 0.99);
  j["get_ms"] = Median(get_ms);
  j["watch_ms"] = Median(watch_ms);
  j["watch_p99_ms"] = Percentile(watch_ms, 0.99);
  j["commit_round_1000_s"] = Median(round_s);
  j["commit_rounds_s"] = round_s;
  j["nodes"] = a.nodes;
  j["ops"] = a.ops;
  return j;
}

Status Run(const Args& a) {
  // The coordinator's info lines (every commit) would mix with the JSON.
  if (LogOptions log = LogOptionsFromEnvironment(); log.level.empty()) {
    log.level = "warn";
    InitLogging("bench", log);
  }
  if (a.nodes < 1 || a.ops < 1 || a.rounds < 1 || a.threads < 1) {
    return InvalidArgumentError("--nodes, --ops, --rounds and --threads must be >= 1");
  }
  nlohmann::json out;
  out["bench"] = "store";
  // The embedded store, over loopback TCP as agents reach it.
  MEMENTO_ASSIGN_OR_RETURN(net::JobToken token, net::JobToken::Generate());
  MEMENTO_ASSIGN_OR_RETURN(auto server, coord::EmbeddedStoreServer::Start("127.0.0.1", 0, token));
  Opener embedded = [&]() -> Result<std::unique_ptr<coord::Store>> {
    return std::unique_ptr<coord::Store>(
        std::make_unique<coord::StoreClient>("127.0.0.1", server->port(), token));
  };
  auto e = Measure(embedded, a, "embedded");
  out["stores"]["embedded"] = e.ok() ? *e : nlohmann::json{{"error", e.status().ToString()}};
  server.reset();

  // etcd: the given one, or one started here.
  std::string url = a.etcd_url;
  std::unique_ptr<coord::EtcdProcess> etcd;
  std::string dir;
  Status etcd_status;
  if (url.empty()) {
    std::string base = a.etcd_dir;
    if (base.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      base = tmp && *tmp ? tmp : "/tmp";
    }
    std::string tmpl = base + "/memento-bench-etcd-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) return ErrnoError("mkdtemp " + tmpl, errno);
    dir = tmpl;
    auto started =
        coord::EtcdProcess::Start(dir, Deadline::AfterSeconds(30), EtcdBinaryFromEnvironment());
    if (started.ok()) {
      etcd = std::move(*started);
      url = etcd->url();
      out["etcd_started"] = url + " (data in " + etcd->data_dir() + ")";
    } else {
      etcd_status = started.status();
    }
  }
  if (etcd_status.ok()) {
    Opener open_etcd = [&]() { return coord::OpenStore(url, "", Deadline::AfterSeconds(10)); };
    auto r = Measure(open_etcd, a, "etcd");
    out["stores"]["etcd"] = r.ok() ? *r : nlohmann::json{{"error", r.status().ToString()}};
    out["stores"]["etcd"]["url"] = url;
  } else {
    out["stores"]["etcd"] = nlohmann::json{{"error", etcd_status.ToString()}};
  }
  etcd.reset();
  if (!dir.empty()) std::filesystem::remove_all(dir);
  memento::tools::PrintJson("memento.bench.store/1", std::move(out));
  return Status::Ok();
}

void Setup(CLI::App& bench, CommandContext& ctx) {
  auto args = std::make_shared<Args>();
  auto* cmd = bench.add_subcommand(
      "store",
      "Coordination store latency (put, get, watch) and a 1,000-node commit round, for the "
      "embedded store and etcd");
  cmd->add_option("--etcd", args->etcd_url,
                  "measure this etcd (etcd://HOST:PORT[,...]); default: start one on loopback "
                  "(needs the etcd binary)");
  cmd->add_option("--etcd-dir", args->etcd_dir,
                  "where the started etcd keeps its data (default $TMPDIR or /tmp); the disk's "
                  "fsync latency is part of etcd's put latency");
  cmd->add_option("--nodes", args->nodes, "simulated nodes in a commit round")
      ->capture_default_str();
  cmd->add_option("--ops", args->ops, "puts, gets and watched puts measured")
      ->capture_default_str();
  cmd->add_option("--rounds", args->rounds, "commit rounds (the median is reported)")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "threads sending the nodes' reports")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print JSON (the only format; accepted for symmetry)");
  cmd->callback([args, &ctx] { ctx.exit_code = ReportStatus(Run(*args)); });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_BENCH(store, memento::tools::Setup);
