// EtcdStore::WatchPoll (docs/etcd.md, "Watch streams"): one long-lived watch
// stream per prefix serves consecutive polls; a poll it cannot serve uses a
// one-shot stream. Shared types: etcd_internal.h.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "common/thread_cpu.h"
#include "coord/etcd_internal.h"

namespace memento::coord {

Status EtcdStore::CheckNotFuture(const std::string& prefix, int64_t after, int64_t header_revision,
                                 Deadline deadline) {
  if (after <= header_revision) return Status::Ok();
  // A watch's header can lag a write that already returned by a revision or
  // two: ask the store itself before calling the revision impossible.
  MEMENTO_ASSIGN_OR_RETURN(
      json cur,
      Call("/v3/kv/range", json{{"key", B64("/")}, {"count_only", true}}, deadline, true));
  const int64_t now = I64(cur["header"], "revision");
  if (after <= now) return Status::Ok();
  return FailedPreconditionError(
      fmt::format("watch of '{}' from revision {}: etcd {} is at revision {} (it restarted without "
                  "its data); re-list",
                  prefix, after, url_, now));
}

// How long past a WatchPoll's deadline its revision check (CheckNotFuture)
// may take: the poll's answer at its deadline is an empty batch, never
// DeadlineExceeded because the check itself was slow (coord_test
// WatchPollSeesPutsAndDeletesInOrder/Etcd failed 3 of 200 at load 23).
namespace {
constexpr Duration kCheckGrace = std::chrono::seconds(2);
Deadline WithCheckGrace(Deadline d) { return d.infinite() ? d : Deadline(d.when() + kCheckGrace); }
}  // namespace

constexpr double kIdleStreamS = 30;
constexpr double kStreamReadS = 5;

std::shared_ptr<EtcdStore::WatchStream> EtcdStore::StreamFor(const std::string& prefix,
                                                             int64_t after) {
  std::vector<std::shared_ptr<WatchStream>> retired;
  std::shared_ptr<WatchStream> out;
  {
    MutexLock l(&streams_mu_);
    for (auto it = streams_.begin(); it != streams_.end();) {
      bool idle;
      {
        MutexLock sl(&it->second->mu);
        idle = it->second->ended || SecondsBetween(it->second->last_used, Now()) > kIdleStreamS;
      }
      if (idle && it->first != prefix) {
        retired.push_back(std::move(it->second));
        it = streams_.erase(it);
      } else {
        ++it;
      }
    }
    auto it = streams_.find(prefix);
    if (it != streams_.end()) {
      std::shared_ptr<WatchStream>& ws = it->second;
      MutexLock sl(&ws->mu);
      if (ws->ended) {
        // Deliver what it received, then its end; the next poll starts anew.
        if (ws->events.empty() || after < ws->served_through) {
          retired.push_back(std::move(ws));
          streams_.erase(it);
        } else {
          out = ws;
        }
      } else if (after >= ws->served_through && after >= ws->from) {
        out = ws;
      }
      // else: an older position than the stream's: a one-shot poll (nullptr).
      if (out) ws->last_used = Now();  // out is ws: the lock held is ws->mu
    }
    if (!out && streams_.find(prefix) == streams_.end()) {
      out = std::make_shared<WatchStream>();
      out->prefix = prefix;
      out->from = after;
      {
        MutexLock sl(&out->mu);
        out->served_through = after;
        out->last_used = Now();
      }
      streams_[prefix] = out;
      out->thread = std::thread([this, ws = out] {
        NameThisThread("etcd-watch");
        RunWatchStream(ws);
      });
    }
  }
  for (auto& ws : retired) {
    ws->Stop();
    if (ws->thread.joinable()) ws->thread.join();
  }
  return out;
}

void EtcdStore::RunWatchStream(const std::shared_ptr<WatchStream>& ws) {
  int64_t pos = ws->from;  // every event up to here was delivered
  Status refused, s;
  while (!ws->stop.load()) {
    json create = PrefixRange(ws->prefix);
    create["start_revision"] = std::to_string(pos + 1);
    // Each read waits at most kStreamReadS: a quiet stream is re-opened from
    // `pos` (transparent to the polls), and a Stop() that raced the start of
    // a request is noticed within that time.
    s = Stream(
        "/v3/watch", json{{"create_request", create}}, Deadline::AfterSeconds(kStreamReadS),
        [&](const json& m) {
          if (ws->stop.load()) return false;
          const int64_t compacted = I64(m, "compact_revision");
          if (compacted > 0) {
            refused = FailedPreconditionError(fmt::format(
                "watch of '{}' from revision {}: etcd {} compacted its history up to {}; re-list",
                ws->prefix, pos, url_, compacted));
            return false;
          }
          if (m.value("created", false)) {
            const int64_t header = I64(m["header"], "revision");
            refused = CheckNotFuture(ws->prefix, pos, header, Deadline::AfterSeconds(10));
            if (!refused.ok()) return false;
            MutexLock l(&ws->mu);
            ws->known_rev = std::max({ws->known_rev, header, pos});
          }
          if (m.value("canceled", false)) {
            refused = FailedPreconditionError(
                fmt::format("etcd {} cancelled the watch of '{}': {}", url_, ws->prefix,
                            m.value("cancel_reason", std::string("no reason given"))));
            return false;
          }
          auto ev = m.find("events");
          if (ev == m.end() || !ev->is_array() || ev->empty()) return true;
          {
            MutexLock l(&ws->mu);
            for (const json& e : *ev) {
              WatchEvent we;
              we.type = e.value("type", std::string("PUT")) == "DELETE" ? WatchEvent::Type::kDelete
                                                                        : WatchEvent::Type::kPut;
              we.kv = ParseKv(e["kv"]);
              if (we.kv.mod_revision <= pos) continue;
              pos = we.kv.mod_revision;
              ws->known_rev = std::max(ws->known_rev, pos);
              ws->events.push_back(std::move(we));
            }
          }
          ws->cv.SignalAll();
          return !ws->stop.load();
        },
        &ws->client);
    if (!refused.ok() || ws->stop.load()) break;
    if (s.code() != StatusCode::kDeadlineExceeded) break;  // ended or failed: not quiet
  }
  {
    MutexLock l(&ws->mu);
    ws->ended = true;
    if (!refused.ok()) {
      ws->end_status = refused;
    } else if (!s.ok()) {
      ws->end_status = s;
    } else {
      ws->end_status =
          UnavailableError(fmt::format("etcd {}: the watch of '{}' was closed", url_, ws->prefix));
    }
  }
  ws->cv.SignalAll();
}

Result<WatchBatch> EtcdStore::WatchPoll(const std::string& prefix, int64_t after_revision,
                                        Deadline deadline) {
  if (after_revision < 0) after_revision = 0;
  std::shared_ptr<WatchStream> ws = StreamFor(prefix, after_revision);
  if (!ws) return OneShotWatchPoll(prefix, after_revision, deadline);
  int64_t known;
  {
    MutexLock l(&ws->mu);
    known = ws->known_rev;
  }
  if (after_revision > known) {
    // A revision the stream has not seen (learnt from a List, or from a store
    // that since restarted empty): confirm it with the store once. The
    // check may run past the poll's deadline (kCheckGrace): a short poll on a
    // loaded machine returns an empty batch, not DeadlineExceeded.
    MEMENTO_RETURN_IF_ERROR(
        CheckNotFuture(prefix, after_revision, known, WithCheckGrace(deadline)));
    MutexLock l(&ws->mu);
    ws->known_rev = std::max(ws->known_rev, after_revision);
  }
  MutexLock l(&ws->mu);
  for (;;) {
    while (!ws->events.empty() && ws->events.front().kv.mod_revision <= after_revision) {
      ws->events.pop_front();
    }
    ws->served_through = std::max(ws->served_through, after_revision);
    ws->last_used = Now();
    if (!ws->events.empty()) {
      WatchBatch batch;
      batch.epoch = epoch_.load();
      batch.events.assign(ws->events.begin(), ws->events.end());
      batch.revision = batch.events.back().kv.mod_revision;
      return batch;
    }
    if (ws->ended) return ws->end_status;
    if (deadline.expired()) {
      WatchBatch batch;
      batch.epoch = epoch_.load();
      batch.revision = after_revision;  // nothing new up to here
      return batch;
    }
    ws->cv.WaitUntil(&l, deadline.when());
  }
}

Result<WatchBatch> EtcdStore::OneShotWatchPoll(const std::string& prefix, int64_t after_revision,
                                               Deadline deadline) {
  if (after_revision < 0) after_revision = 0;
  json create = PrefixRange(prefix);
  create["start_revision"] = std::to_string(after_revision + 1);
  WatchBatch batch;
  Status refused;
  bool created = false;
  Status s = Stream("/v3/watch", json{{"create_request", create}}, deadline, [&](const json& m) {
    const int64_t compacted = I64(m, "compact_revision");
    if (compacted > 0) {
      refused = FailedPreconditionError(fmt::format(
          "watch of '{}' from revision {}: etcd {} compacted its history up to {}; re-list", prefix,
          after_revision, url_, compacted));
      return false;
    }
    if (m.value("created", false)) {
      created = true;
      Status future = CheckNotFuture(prefix, after_revision, I64(m["header"], "revision"),
                                     WithCheckGrace(deadline));
      if (!future.ok()) {
        refused = future;
        return false;
      }
    }
    if (m.value("canceled", false)) {
      refused = FailedPreconditionError(
          fmt::format("etcd {} cancelled the watch of '{}': {}", url_, prefix,
                      m.value("cancel_reason", std::string("no reason given"))));
      return false;
    }
    auto ev = m.find("events");
    if (ev == m.end() || !ev->is_array() || ev->empty()) return true;
    for (const json& e : *ev) {
      WatchEvent we;
      we.type = e.value("type", std::string("PUT")) == "DELETE" ? WatchEvent::Type::kDelete
                                                                : WatchEvent::Type::kPut;
      we.kv = ParseKv(e["kv"]);
      if (we.kv.mod_revision <= after_revision) continue;
      batch.revision = std::max(batch.revision, we.kv.mod_revision);
      batch.events.push_back(std::move(we));
    }
    return batch.events.empty();
  });
  if (!refused.ok()) return refused;
  batch.epoch = epoch_.load();
  if (!batch.events.empty()) return batch;
  if (!s.ok() && s.code() != StatusCode::kDeadlineExceeded) return s;
  // The deadline passed (before etcd confirmed the watch, too: a short poll on
  // a loaded machine): an empty batch, as Store::WatchPoll promises. It claims
  // nothing past after_revision; an etcd that is down fails above (Unavailable).
  batch.revision = after_revision;  // nothing new up to here
  return batch;
}

}  // namespace memento::coord
