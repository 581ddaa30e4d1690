#include "agent/scrub.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "agent/thread_cpu.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/thread_cpu.h"
#include "fmt/format.h"

namespace memento::agent {

std::unique_ptr<Scrubber> Scrubber::Start(const ScrubOptions& options, shm::NodeStore* store) {
  if (options.bytes_per_s == 0) return nullptr;
  std::unique_ptr<Scrubber> s(new Scrubber(options, store));
  s->WriteReport();  // replaces an earlier agent's report
  s->thread_ = std::thread([p = s.get()] {
    NameThisThread("scrub");
    p->Run();
  });
  MEMENTO_LOG_INFO("scrub: every {:g} s at most {} bytes/s ({})", options.interval_s,
                   options.bytes_per_s,
                   options.status_path.empty() ? "no report file" : options.status_path);
  return s;
}

Scrubber::~Scrubber() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

ScrubStats Scrubber::Stats() {
  MutexLock l(&mu_);
  ScrubStats s = stats_;
  s.corrupt.clear();
  for (const auto& [key, f] : findings_) s.corrupt.push_back(f);
  return s;
}

Status Scrubber::WaitForPasses(uint64_t passes, Deadline deadline) {
  MutexLock l(&mu_);
  while (stats_.passes < passes) {
    if (stop_) return AbortedError("the scrubber stopped");
    if (deadline.infinite()) {
      cv_.Wait(&l);
    } else if (!cv_.WaitUntil(&l, deadline.when()) && stats_.passes < passes) {
      return DeadlineExceededError(
          fmt::format("scrub: {} passes done, {} awaited", stats_.passes, passes));
    }
  }
  return Status::Ok();
}

bool Scrubber::SleepFor(double seconds) {
  auto until = Now() + std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::duration<double>(seconds));
  MutexLock l(&mu_);
  while (!stop_) {
    if (!cv_.WaitUntil(&l, until)) break;
  }
  return !stop_;
}

bool Scrubber::Pace(uint64_t bytes) {
  // Token bucket over the pass: `pace_bytes_` may have been hashed by now.
  double due = static_cast<double>(pace_bytes_) / static_cast<double>(options_.bytes_per_s);
  double ahead = due - SecondsBetween(pace_start_, Now());
  if (ahead > 0 && !SleepFor(ahead)) return false;
  pace_bytes_ += bytes;
  {
    MutexLock l(&mu_);
    if (stop_) return false;
    stats_.bytes += bytes;
  }
  return true;
}

void Scrubber::Run() {
  for (uint64_t pass = 1;; ++pass) {
    if (!SleepFor(options_.interval_s)) return;
    const double cpu0 = ThreadCpuSeconds();
    const bool go_on = Pass(pass);
    {
      MutexLock l(&mu_);
      stats_.cpu_s += ThreadCpuSeconds() - cpu0;
    }
    if (!go_on) return;
    {
      MutexLock l(&mu_);
      stats_.passes = pass;
      stats_.last_pass_end_unix_ns = WallNanos();
    }
    cv_.SignalAll();
    WriteReport();
  }
}

bool Scrubber::Pass(uint64_t pass) {
  pace_start_ = Now();
  pace_bytes_ = 0;
  for (int rank : store_->Ranks()) {
    for (const shm::SlotStatus& s : store_->Inventory(rank)) {
      // Only versions at rest: a slot being written is its writer's business.
      if (s.state != shm::SlotState::kComplete) {
        MutexLock l(&mu_);
        findings_.erase({rank, s.slot});
        continue;
      }
      Status st = store_->Verify(
          rank, s.slot, [this](uint64_t n) { return Pace(n); }, options_.piece_bytes);
      {
        MutexLock l(&mu_);
        if (stop_) return false;
      }
      if (st.code() == StatusCode::kAborted) {
        // Rewritten under the check (or stopped): nothing learned.
        MutexLock l(&mu_);
        ++stats_.slots_rewritten;
        continue;
      }
      bool fresh = false;
      ScrubFinding f;
      {
        MutexLock l(&mu_);
        ++stats_.slots_checked;
        auto key = std::make_pair(rank, s.slot);
        if (st.ok() || st.code() == StatusCode::kFailedPrecondition) {
          findings_.erase(key);
          continue;
        }
        auto it = findings_.find(key);
        if (it != findings_.end() && it->second.generation == s.generation &&
            it->second.step == s.step) {
          continue;  // known, already reported
        }
        f.rank = rank;
        f.slot = s.slot;
        f.step = s.step;
        f.generation = s.generation;
        f.error = st.ToString();
        f.pass = pass;
        f.found_unix_ns = WallNanos();
        findings_[key] = f;
        fresh = true;
      }
      if (fresh) {
        MEMENTO_LOG_ERROR(
            "scrub: rank {} slot {} holds a corrupt version of step {} (pass {}); it is left out "
            "of this node's inventory until rewritten: {}",
            rank, s.slot, s.step, pass, f.error);
        WriteReport();
      }
    }
  }
  return true;
}

std::string Scrubber::ReportJson() {
  ScrubStats s = Stats();
  nlohmann::json corrupt = nlohmann::json::array();
  for (const ScrubFinding& f : s.corrupt) {
    corrupt.push_back({{"rank", f.rank},
                       {"slot", f.slot},
                       {"step", f.step},
                       {"generation", f.generation},
                       {"error", f.error},
                       {"pass", f.pass},
                       {"found_unix_ns", f.found_unix_ns}});
  }
  nlohmann::json j = {{"format", 1},
                      {"agent_pid", getpid()},
                      {"bytes_per_s", options_.bytes_per_s},
                      {"interval_s", options_.interval_s},
                      {"passes", s.passes},
                      {"bytes", s.bytes},
                      {"slots_checked", s.slots_checked},
                      {"slots_rewritten", s.slots_rewritten},
                      {"last_pass_end_unix_ns", s.last_pass_end_unix_ns},
                      {"written_unix_ns", WallNanos()},
                      {"corrupt", corrupt}};
  return j.dump(1);
}

void Scrubber::WriteReport() {
  if (options_.status_path.empty()) return;
  std::string text = ReportJson() + "\n";
  std::string tmp = options_.status_path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    MEMENTO_LOG_WARN("scrub: cannot write {}: {}", tmp, std::strerror(errno));
    return;
  }
  bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!ok || rename(tmp.c_str(), options_.status_path.c_str()) != 0) {
    MEMENTO_LOG_WARN("scrub: cannot write {}", options_.status_path);
    unlink(tmp.c_str());
  }
}

}  // namespace memento::agent
