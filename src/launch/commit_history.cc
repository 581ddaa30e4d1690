#include "launch/commit_history.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <map>

#include "coord/keys.h"

namespace memento::launch {

using nlohmann::json;

json CommitHistorySummary::ToJson() const {
  json skips = json::array();
  for (const Skip& k : skipped) {
    json j = {{"step", k.id.step}, {"epoch", k.id.epoch}, {"node", k.node}};
    if (!k.reason.empty()) j["reason"] = k.reason;
    skips.push_back(std::move(j));
  }
  json passed_over = json::array();
  for (const coord::CommitId& id : uncommitted) {
    passed_over.push_back({{"step", id.step}, {"epoch", id.epoch}});
  }
  json by_attempt_j = json::array();
  for (const auto& [attempt, steps] : by_attempt) {
    by_attempt_j.push_back({{"attempt", attempt}, {"steps", steps}});
  }
  return {{"count", count},
          {"first", first},
          {"last", last},
          {"gap_max_s", gap_max_s},
          {"gap_max_steps", gap_max_steps},
          {"gap_at_step", gap_at_step},
          {"uncommitted", passed_over},
          {"by_attempt", by_attempt_j},
          {"skipped", skips},
          {"unprotected_steps", unprotected_steps},
          {"unprotected_reason", unprotected_reason},
          {"coordinator", coordinator}};
}

std::string CommitHistorySummary::ToString() const {
  if (count == 0) return "commits: none";
  std::string s = fmt::format("commits: {} (steps {}..{}); largest gap {:.2f} s / {} step(s)",
                              count, first, last, gap_max_s, gap_max_steps);
  if (gap_at_step >= 0) s += fmt::format(" before step {}", gap_at_step);
  if (!skipped.empty()) {
    // "skipped 3 step(s): 8 (node1), 12 (node1 node2 node3), 12@1 (node2)":
    // a step of a commit epoch after the first as <step>@<epoch>, the form
    // of commit/latest (the same step number after a rollback is another
    // step).
    std::map<coord::CommitId, std::string> by_step;
    for (const Skip& k : skipped) {
      std::string& nodes = by_step[k.id];
      nodes += (nodes.empty() ? "" : " ") + k.node;
    }
    s += fmt::format("; skipped {} step(s):", by_step.size());
    size_t shown = 0;
    for (const auto& [id, nodes] : by_step) {
      if (shown++ == 8) {
        s += " ...";
        break;
      }
      s += fmt::format("{} {} ({})", shown == 1 ? "" : ",", coord::FormatCommitId(id), nodes);
    }
  }
  if (!uncommitted.empty()) {
    s += fmt::format("; NEVER COMMITTED (reported, not skipped): {}", uncommitted.size());
    size_t shown = 0;
    for (const coord::CommitId& id : uncommitted) {
      if (shown++ == 8) {
        s += " ...";
        break;
      }
      s += fmt::format(" {}", coord::FormatCommitId(id));
    }
  }
  return s;
}

CommitHistory::~CommitHistory() {
  commit_watcher_.reset();
  skip_watcher_.reset();
}

void CommitHistory::SetAttempt(int attempt) {
  MutexLock l(&mu_);
  attempt_ = attempt;
  attempt_began_ = Now();
}

void CommitHistory::OnCommit(int64_t step, const std::vector<int64_t>& superseded, uint64_t epoch) {
  MutexLock l(&mu_);
  commits_.push_back(Commit{step, attempt_, Now()});
  for (int64_t s : superseded) superseded_.insert(coord::CommitId{epoch, s});
  // Passed over in an abandoned history (an older epoch), committed in this
  // one: not listed (docs/launch.md, "Commit history").
  for (auto it = superseded_.begin(); it != superseded_.end();) {
    it = it->step == step && it->epoch <= epoch ? superseded_.erase(it) : std::next(it);
  }
}

double CommitHistory::QuietSeconds() {
  MutexLock l(&mu_);
  TimePoint since = attempt_began_;
  if (!commits_.empty() && commits_.back().attempt == attempt_) {
    since = std::max(since, commits_.back().at);
  }
  return SecondsBetween(since, Now());
}

bool CommitHistory::IsUnprotectedReason(const std::string& reason) {
  return reason.find("ResourceExhausted") != std::string::npos;
}

void CommitHistory::OnSkip(int64_t step, const std::string& node, const std::string& reason,
                           uint64_t epoch) {
  MutexLock l(&mu_);
  const coord::CommitId id{epoch, step};
  std::string& kept = skipped_[{id, node}];
  // A record put again (an agent republishes its skips to a restarted
  // store, without the reason) keeps the reason first seen.
  if (reason.empty()) return;
  kept = reason;
  if (IsUnprotectedReason(reason)) {
    if (unprotected_.empty()) {
      unprotected_reason_ =
          fmt::format("step {} on {}: {}", coord::FormatCommitId(id), node, reason);
    }
    unprotected_.insert(id);
  }
}

std::pair<int64_t, std::string> CommitHistory::Unprotected() {
  MutexLock l(&mu_);
  return {static_cast<int64_t>(unprotected_.size()), unprotected_reason_};
}

void CommitHistory::WatchSkips(coord::Store* store, const std::string& job) {
  skip_watcher_.reset();
  if (store == nullptr) return;
  const std::string prefix = coord::JobKeys(job).SkippedPrefix();
  skip_watcher_ = std::make_unique<coord::Watcher>(
      store, prefix, 0, [this, keys = coord::JobKeys(job)](const coord::WatchEvent& ev) {
        if (ev.type != coord::WatchEvent::Type::kPut) return;
        // .../skipped/<step>/<node>[@<epoch>]
        auto k = coord::ParseSkippedKey(keys, ev.kv.key);
        if (k.ok()) OnSkip(k->step, k->node, ev.kv.value, k->epoch);
      });
}

void CommitHistory::WatchCommits(coord::Store* store, const std::string& job) {
  commit_watcher_.reset();
  last_seen_.reset();
  if (store == nullptr) return;
  const std::string key = coord::JobKeys(job).CommitLatest();
  commit_watcher_ =
      std::make_unique<coord::Watcher>(store, key, 0, [this, key](const coord::WatchEvent& ev) {
        if (ev.type != coord::WatchEvent::Type::kPut || ev.kv.key != key) return;
        auto id = coord::ParseCommitId(ev.kv.value);
        if (!id.ok()) return;
        // Republished (a store restarted empty) or older: seen already.
        if (last_seen_.has_value() && !(*last_seen_ < *id)) return;
        const bool epoch_start = last_seen_.has_value() && id->epoch != last_seen_->epoch;
        last_seen_ = *id;
        if (!epoch_start) OnCommit(id->step, {}, id->epoch);
      });
}

CommitHistorySummary CommitHistory::Summary() {
  MutexLock l(&mu_);
  CommitHistorySummary s;
  s.count = static_cast<int64_t>(commits_.size());
  if (!commits_.empty()) {
    s.first = commits_.front().step;
    s.last = commits_.back().step;
  }
  for (const Commit& c : commits_) s.by_attempt[c.attempt].push_back(c.step);
  for (size_t i = 1; i < commits_.size(); ++i) {
    const Commit& a = commits_[i - 1];
    const Commit& b = commits_[i];
    if (a.attempt != b.attempt) continue;
    const double gap_s = SecondsBetween(a.at, b.at);
    if (gap_s > s.gap_max_s) {
      s.gap_max_s = gap_s;
      s.gap_at_step = b.step;
    }
    s.gap_max_steps = std::max(s.gap_max_steps, b.step - a.step);
  }
  // A skip explains a pass-over of the same step in the same epoch only.
  std::set<coord::CommitId> skipped_ids;
  for (const auto& [key, reason] : skipped_) {
    skipped_ids.insert(key.first);
    s.skipped.push_back(CommitHistorySummary::Skip{key.first, key.second, reason});
  }
  for (const coord::CommitId& id : superseded_) {
    if (skipped_ids.count(id) == 0) s.uncommitted.push_back(id);
  }
  s.unprotected_steps = static_cast<int64_t>(unprotected_.size());
  s.unprotected_reason = unprotected_reason_;
  return s;
}

}  // namespace memento::launch
