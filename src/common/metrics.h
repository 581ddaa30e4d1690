// Prometheus text exposition (format 0.0.4) of a process's counters: the
// agent's `--metrics-listen` endpoint (docs/operating.md). The writer holds no
// state of its own between scrapes: every value is read, at scrape time, from
// the counters the components keep where the work happens (NodeStore,
// DurableStreamer, JobMember, PeerService, Scrubber, the agent's request
// handler), so there is no second bookkeeping to drift.
//
//   MetricsText m;
//   m.Counter("memento_snapshots_total", "Snapshots the trainers completed", n);
//   m.Gauge("memento_shm_bytes", "Shared memory the slots take", used);
//   m.Gauge("memento_rank_step", "Newest complete step", step, {{"rank", "3"}});
//   std::string body = m.str();   // Content-Type: kMetricsContentType
//
// Names must match [a-zA-Z_:][a-zA-Z0-9_:]* (checked: a bad one is a bug,
// MEMENTO_CHECK). Label values are escaped (backslash, quote, newline).
// Thread safety: a MetricsText is used by one thread.
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

namespace memento {

inline constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

class MetricsText {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  // One sample. The first sample of a name writes its # HELP and # TYPE lines;
  // later samples of the same name (other labels) must follow it directly
  // (the exposition format wants a metric's samples together).
  void Counter(const std::string& name, const std::string& help, double value,
               const Labels& labels = {});
  void Gauge(const std::string& name, const std::string& help, double value,
             const Labels& labels = {});
  const std::string& str() const { return out_; }

 private:
  void Sample(const std::string& name, const char* type, const std::string& help, double value,
              const Labels& labels);
  std::string out_;
  std::string last_name_;
  std::set<std::string> names_;
};

// Parses one sample line's value out of an exposition `text`: the value of
// `name` with exactly `labels` ("" or e.g. `rank="0"`). False when absent.
// For tests and `memento` tools that read an agent's endpoint.
bool FindMetric(const std::string& text, const std::string& name, const std::string& labels,
                double* value);

}  // namespace memento
