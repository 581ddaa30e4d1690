// Store semantics, run against the in-process MemoryStore, the embedded TCP
// store (StoreClient -> EmbeddedStoreServer on an ephemeral port) and a real
// etcd on loopback (EtcdStore -> EtcdProcess; skipped without an etcd binary).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "common/subprocess.h"
#include "common/test_util.h"
#include "coord/embedded_store.h"
#include "coord/etcd_process.h"
#include "coord/memory_store.h"

namespace memento::coord {
namespace {

net::JobToken Token() { return net::JobToken::FromSecret("coord-test-token-0123456789").value(); }
Deadline Soon() { return Deadline::AfterSeconds(10); }

enum class Backend { kMemory, kTcp, kEtcd };

class StoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    switch (GetParam()) {
      case Backend::kTcp:
        server_ = EmbeddedStoreServer::Start("127.0.0.1", 0, Token()).value();
        store_ = std::make_unique<StoreClient>("127.0.0.1", server_->port(), Token());
        break;
      case Backend::kEtcd: {
        // A real etcd on loopback (scripts/setup.sh installs etcd-server).
        auto etcd = EtcdProcess::Start(dir_.path(), Deadline::AfterSeconds(30));
        if (etcd.status().code() == StatusCode::kNotFound) GTEST_SKIP() << etcd.status();
        ASSERT_TRUE(etcd.ok()) << etcd.status();
        etcd_ = std::move(*etcd);
        store_ = Other();
        ASSERT_NE(store_, nullptr);
        break;
      }
      case Backend::kMemory:
        store_ = std::make_unique<MemoryStore>();
        break;
    }
  }
  // Another independent client of the same store (a second "process").
  std::unique_ptr<Store> Other() {
    if (GetParam() == Backend::kTcp) {
      return std::make_unique<StoreClient>("127.0.0.1", server_->port(), Token());
    }
    if (GetParam() == Backend::kEtcd) {
      auto s = OpenStore(etcd_->url(), "", Soon());
      EXPECT_TRUE(s.ok()) << s.status();
      return s.ok() ? std::move(*s) : nullptr;
    }
    return nullptr;
  }
  Store& other() {
    if (!other_) other_ = Other();
    return other_ ? *other_ : *store_;
  }
  testing::ScratchDir dir_{"etcd-store-test"};
  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EmbeddedStoreServer> server_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Store> other_;
};

TEST_P(StoreTest, SetGetListDelete) {
  Store& s = *store_;
  EXPECT_EQ(s.Get("/a", Soon()).status().code(), StatusCode::kNotFound);
  auto r1 = s.Set("/a", "1", Soon());
  ASSERT_TRUE(r1.ok()) << r1.status();
  auto r2 = s.Set("/b/x", std::string("bin\0ary", 7), Soon());
  ASSERT_TRUE(r2.ok());
  EXPECT_GT(*r2, *r1);
  ASSERT_TRUE(s.Set("/b/y", "y", Soon()).ok());
  auto kv = other().Get("/b/x", Soon());
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->value, std::string("bin\0ary", 7));
  EXPECT_EQ(kv->mod_revision, *r2);
  auto l = other().List("/b/", Soon());
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->kvs.size(), 2u);
  EXPECT_EQ(l->kvs[0].key, "/b/x");
  EXPECT_EQ(l->kvs[1].key, "/b/y");
  EXPECT_GE(l->revision, *r2);
  EXPECT_NE(l->epoch, 0u);
  EXPECT_TRUE(*s.Delete("/a", Soon()));
  EXPECT_FALSE(*s.Delete("/a", Soon()));
  EXPECT_EQ(s.Get("/a", Soon()).status().code(), StatusCode::kNotFound);
}

TEST_P(StoreTest, CompareAndSwapAndAdd) {
  Store& s = *store_;
  auto c = s.CompareAndSwap("/k", std::nullopt, "v1", Soon());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->swapped);
  c = s.CompareAndSwap("/k", std::nullopt, "v2", Soon());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->swapped);
  ASSERT_TRUE(c->current.has_value());
  EXPECT_EQ(c->current->value, "v1");
  c = s.CompareAndSwap("/k", std::string("wrong"), "v2", Soon());
  EXPECT_FALSE(c->swapped);
  c = s.CompareAndSwap("/k", std::string("v1"), "v2", Soon());
  EXPECT_TRUE(c->swapped);
  EXPECT_EQ(c->current->value, "v2");
  c = s.CompareAndSwap("/missing", std::string("x"), "y", Soon());
  EXPECT_FALSE(c->swapped);
  EXPECT_FALSE(c->current.has_value());

  EXPECT_EQ(*s.Add("/n", 5, Soon()), 5);
  EXPECT_EQ(*s.Add("/n", -2, Soon()), 3);
  EXPECT_EQ(s.Get("/n", Soon())->value, "3");
  EXPECT_EQ(s.Add("/k", 1, Soon()).status().code(), StatusCode::kInvalidArgument);
  // A counter that would overflow is refused and keeps its value (the
  // store_request fuzz target found the signed overflow).
  ASSERT_TRUE(s.Add("/big", INT64_MAX - 1, Soon()).ok());
  EXPECT_EQ(s.Add("/big", 2, Soon()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*s.Add("/big", 0, Soon()), INT64_MAX - 1);
}

TEST_P(StoreTest, CasRaceCountsEveryIncrementOnce) {
  // Many threads, each with its own client, increment a counter by CAS loops.
  constexpr int kThreads = 8, kIncrements = 40;
  std::vector<std::thread> threads;
  std::atomic<int> cas_failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::unique_ptr<Store> mine = Other();
      Store& s = mine ? *mine : *store_;
      for (int i = 0; i < kIncrements; ++i) {
        for (;;) {
          auto cur = s.Get("/ctr", Soon());
          std::optional<std::string> expected;
          int64_t v = 0;
          if (cur.ok()) {
            expected = cur->value;
            v = std::stoll(cur->value);
          }
          auto c = s.CompareAndSwap("/ctr", expected, std::to_string(v + 1), Soon());
          ASSERT_TRUE(c.ok()) << c.status();
          if (c->swapped) break;
          cas_failures.fetch_add(1);
        }
        ASSERT_TRUE(s.Add("/adds", 1, Soon()).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store_->Get("/ctr", Soon())->value, std::to_string(kThreads * kIncrements));
  EXPECT_EQ(store_->Get("/adds", Soon())->value, std::to_string(kThreads * kIncrements));
  std::fprintf(stderr, "cas retries: %d\n", cas_failures.load());
}

TEST_P(StoreTest, WaitBlocksUntilAllKeysExist) {
  Status early = store_->Wait({"/w1", "/w2"}, Deadline::AfterSeconds(0.05));
  EXPECT_EQ(early.code(), StatusCode::kDeadlineExceeded) << early;
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ASSERT_TRUE(other().Set("/w1", "", Soon()).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ASSERT_TRUE(other().Set("/w2", "", Soon()).ok());
  });
  Status s = store_->Wait({"/w1", "/w2"}, Soon());
  writer.join();
  EXPECT_TRUE(s.ok()) << s;
}

TEST_P(StoreTest, WatchPollSeesPutsAndDeletesInOrder) {
  int64_t start = store_->List("/", Soon())->revision;
  auto empty = store_->WatchPoll("/watch/", start, Deadline::AfterSeconds(0.05));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->events.empty());
  ASSERT_TRUE(other().Set("/other", "x", Soon()).ok());  // not under the prefix
  ASSERT_TRUE(other().Set("/watch/a", "1", Soon()).ok());
  ASSERT_TRUE(other().Delete("/watch/a", Soon()).ok());
  std::vector<WatchEvent> seen;
  int64_t after = start;
  while (seen.size() < 2) {
    auto b = store_->WatchPoll("/watch/", after, Soon());
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_FALSE(b->events.empty());
    seen.insert(seen.end(), b->events.begin(), b->events.end());
    after = b->revision;
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ(seen[0].kv.value, "1");
  EXPECT_EQ(seen[1].type, WatchEvent::Type::kDelete);
  EXPECT_LT(seen[0].kv.mod_revision, seen[1].kv.mod_revision);
  // A revision from the future (a restarted store) is refused.
  EXPECT_EQ(store_->WatchPoll("/", after + 1000, Soon()).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST_P(StoreTest, WatcherDeliversEventsOnItsThread) {
  std::atomic<int> puts{0};
  Watcher w(store_.get(), "/cb/", store_->List("/", Soon())->revision, [&](const WatchEvent& e) {
    if (e.type == WatchEvent::Type::kPut) puts.fetch_add(1);
  });
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(other().Set("/cb/" + std::to_string(i), "", Soon()).ok());
  Deadline d = Soon();
  while (puts.load() < 5 && !d.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  w.Stop();
  EXPECT_EQ(puts.load(), 5);
}

// Regression: a WatchPoll whose wait timed out used to report the store's
// revision at wake-up, so a put that landed during the wait was skipped for
// good by the next poll (commits then stalled for 10 s). Short polls racing a
// writer must still see every put exactly once, in order.
TEST_P(StoreTest, WatchPollThatTimesOutNeverSkipsAConcurrentPut) {
  constexpr int kPuts = 400;
  int64_t after = store_->List("/", Soon())->revision;
  Store& writer_store = other();
  std::atomic<bool> write_failed{false};
  std::atomic<int64_t> last_put{INT64_MAX};  // the last put's revision, once written
  std::thread writer([&] {
    int64_t rev = 0;
    for (int i = 0; i < kPuts && !write_failed.load(); ++i) {
      auto r = writer_store.Set("/race/k", std::to_string(i), Soon());
      if (!r.ok()) write_failed.store(true);
      rev = r.ok() ? *r : rev;
      // Spread the puts so that many land while a poll is waiting.
      std::this_thread::sleep_for(std::chrono::microseconds(200 + (i % 7) * 150));
    }
    last_put.store(rev);
  });
  std::vector<int> seen;
  Status poll_error;
  int polls = 0;
  Deadline give_up = Deadline::AfterSeconds(60);
  // Until every put is seen, or the watch has passed the last put's revision
  // (a skipped put then never comes).
  while (seen.size() < static_cast<size_t>(kPuts) && after < last_put.load() &&
         !give_up.expired() && !write_failed.load()) {
    // Deadlines around the writer's period, so that polls time out while a
    // put is in flight.
    const double wait_s = 0.0002 * (1 + polls++ % 8);
    auto b = store_->WatchPoll("/race/", after, Deadline::AfterSeconds(wait_s));
    if (!b.ok()) {
      // Over TCP the client's own deadline can pass before the reply: the
      // poll is simply repeated from the same revision (as Watcher does).
      if (b.status().code() == StatusCode::kDeadlineExceeded) continue;
      poll_error = b.status();
      break;
    }
    for (const auto& ev : b->events) seen.push_back(std::stoi(ev.kv.value));
    if (b->revision < after) {
      poll_error = InternalError("the watch revision went backwards");
      break;
    }
    after = b->revision;
  }
  write_failed.store(write_failed.load() || !poll_error.ok());
  writer.join();
  ASSERT_TRUE(poll_error.ok()) << poll_error;
  ASSERT_EQ(seen.size(), static_cast<size_t>(kPuts)) << "after " << polls << " polls";
  for (int i = 0; i < kPuts; ++i) ASSERT_EQ(seen[i], i) << "event " << i;
}

TEST_P(StoreTest, LeaseExpiryDeletesKeysAndKeepAliveExtends) {
  auto lease = store_->GrantLease(0.3, Soon());
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(store_->Set("/node/a", "up", Soon(), *lease).ok());
  // Kept alive past several TTLs.
  for (int i = 0; i < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(store_->KeepAlive(*lease, Soon()).ok());
  }
  EXPECT_TRUE(other().Get("/node/a", Soon()).ok());
  int64_t rev = store_->List("/", Soon())->revision;
  // Then left to expire: the key goes away with a delete event.
  Deadline d = Soon();
  while (other().Get("/node/a", Soon()).ok() && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(other().Get("/node/a", Soon()).status().code(), StatusCode::kNotFound);
  auto b = store_->WatchPoll("/node/", rev, Soon());
  ASSERT_TRUE(b.ok());
  ASSERT_FALSE(b->events.empty());
  EXPECT_EQ(b->events.back().type, WatchEvent::Type::kDelete);
  EXPECT_EQ(store_->KeepAlive(*lease, Soon()).code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->Set("/node/b", "", Soon(), *lease).status().code(), StatusCode::kNotFound);

  auto l2 = store_->GrantLease(30, Soon());
  ASSERT_TRUE(store_->Set("/node/c", "", Soon(), *l2).ok());
  ASSERT_TRUE(store_->RevokeLease(*l2, Soon()).ok());
  EXPECT_EQ(store_->Get("/node/c", Soon()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->GrantLease(-1, Soon()).status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest,
                         ::testing::Values(Backend::kMemory, Backend::kTcp, Backend::kEtcd),
                         [](const auto& info) {
                           switch (info.param) {
                             case Backend::kMemory:
                               return "Memory";
                             case Backend::kTcp:
                               return "Tcp";
                             case Backend::kEtcd:
                               return "Etcd";
                           }
                           return "unknown";
                         });

TEST(StoreClientTest, WrongTokenIsRefused) {
  auto server = EmbeddedStoreServer::Start("127.0.0.1", 0, Token()).value();
  StoreClient bad("127.0.0.1", server->port(),
                  net::JobToken::FromSecret("some-other-token-000000").value());
  Status s = bad.Set("/x", "y", Soon()).status();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s;
  EXPECT_EQ(server->store().Get("/x", Soon()).status().code(), StatusCode::kNotFound);
}

TEST(StoreClientTest, UnreachableStoreHitsTheDeadline) {
  auto server = EmbeddedStoreServer::Start("127.0.0.1", 0, Token()).value();
  int port = server->port();
  server.reset();
  StoreClient c("127.0.0.1", port, Token());
  Status s = c.Get("/x", Deadline::AfterSeconds(0.3)).status();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
}

TEST(StoreClientTest, ServerSideWaitHonoursTheCallerDeadline) {
  auto server = EmbeddedStoreServer::Start("127.0.0.1", 0, Token()).value();
  StoreClient c("127.0.0.1", server->port(), Token());
  Status s = c.Wait({"/never"}, Deadline::AfterSeconds(0.2));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  // The connection is still good for the next call.
  EXPECT_TRUE(c.Set("/after", "", Soon()).ok());
}

TEST(OpenStoreTest, Urls) {
  setenv("MEMENTO_JOB_TOKEN", "coord-test-token-0123456789", 1);
  auto server = EmbeddedStoreServer::Start("127.0.0.1", 0, Token()).value();
  auto s = OpenStore("tcp://127.0.0.1:" + std::to_string(server->port()), "", Soon());
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->Set("/opened", "1", Soon()).ok());
  EXPECT_EQ(server->store().Get("/opened", Soon())->value, "1");
  // Bad etcd URLs name what is wrong; an etcd that does not answer is Unavailable.
  auto etcd = OpenStore("etcd://", "", Soon());
  EXPECT_EQ(etcd.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(etcd.status().message().find("no endpoint"), std::string::npos) << etcd.status();
  etcd = OpenStore("etcd://127.0.0.1:2379,nohost", "", Soon());
  EXPECT_EQ(etcd.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(etcd.status().message().find("nohost"), std::string::npos) << etcd.status();
  etcd = OpenStore("etcd://127.0.0.1:1", "", Deadline::AfterSeconds(0.3));
  EXPECT_EQ(etcd.status().code(), StatusCode::kUnavailable) << etcd.status();
  EXPECT_EQ(OpenStore("http://x:1", "", Soon()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenStore("tcp://nohost", "", Soon()).status().code(), StatusCode::kInvalidArgument);
  unsetenv("MEMENTO_JOB_TOKEN");
}

// ---- etcd faults: a real etcd killed (kill -9) and restarted ------------------

class EtcdFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = EtcdProcess::Start(dir_.path(), Deadline::AfterSeconds(30));
    if (etcd.status().code() == StatusCode::kNotFound) GTEST_SKIP() << etcd.status();
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = std::move(*etcd);
    auto s = OpenStore(etcd_->url(), "", Soon());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  testing::ScratchDir dir_{"etcd-fault-test"};
  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<Store> store_;
};

// Killed and restarted with its data directory: nothing is lost, revisions
// continue, and a Watcher that was running across the outage delivers every
// put exactly from where it was (it resumes from its revision).
TEST_F(EtcdFaultTest, KilledAndRestartedWithItsDataLosesNothingAndWatchResumes) {
  Mutex mu;
  std::vector<std::string> seen;
  const int64_t start = store_->List("/", Soon())->revision;
  Watcher w(store_.get(), "/job/", start, [&](const WatchEvent& e) {
    MutexLock l(&mu);
    if (e.type == WatchEvent::Type::kPut) seen.push_back(e.kv.value);
  });
  int64_t before = 0;
  for (int i = 0; i < 5; ++i)
    before = store_->Set("/job/" + std::to_string(i), "a" + std::to_string(i), Soon()).value();
  etcd_->Kill();
  // While it is down a call fails (Unavailable or its deadline), it does not hang.
  auto down = store_->Set("/job/down", "x", Deadline::AfterSeconds(0.3));
  EXPECT_FALSE(down.ok());
  ASSERT_TRUE(etcd_->Restart(/*keep_data=*/true, Deadline::AfterSeconds(30)).ok());
  auto after_restart = store_->Set("/job/5", "a5", Soon());
  ASSERT_TRUE(after_restart.ok()) << after_restart.status();
  EXPECT_GT(*after_restart, before);
  for (int i = 6; i < 10; ++i)
    ASSERT_TRUE(store_->Set("/job/" + std::to_string(i), "a" + std::to_string(i), Soon()).ok());
  auto list = store_->List("/job/", Soon());
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->kvs.size(), 10u);
  Deadline d = Soon();
  for (;;) {
    {
      MutexLock l(&mu);
      if (seen.size() >= 10 || d.expired()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  w.Stop();
  MutexLock l(&mu);
  ASSERT_EQ(seen.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(seen[i], "a" + std::to_string(i));
}

// Restarted empty (its data directory lost): the keys are gone, a watch from
// the old revision is refused (FailedPrecondition: re-list), the epoch changes,
// and a Watcher re-lists and delivers what is written again.
TEST_F(EtcdFaultTest, RestartedEmptyIsSeenAsANewStore) {
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(store_->Set("/job/k" + std::to_string(i), "old", Soon()).ok());
  auto before = store_->List("/job/", Soon());
  ASSERT_TRUE(before.ok());
  Mutex mu;
  std::vector<std::string> seen;
  Watcher w(store_.get(), "/job/", before->revision, [&](const WatchEvent& e) {
    MutexLock l(&mu);
    if (e.type == WatchEvent::Type::kPut) seen.push_back(e.kv.value);
  });
  ASSERT_TRUE(etcd_->Restart(/*keep_data=*/false, Deadline::AfterSeconds(30)).ok());
  auto after = store_->List("/job/", Soon());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->kvs.empty());
  EXPECT_LT(after->revision, before->revision);
  EXPECT_NE(after->epoch, before->epoch);
  EXPECT_EQ(store_->WatchPoll("/job/", before->revision, Soon()).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_->Set("/job/again", "new", Soon()).ok());
  Deadline d = Soon();
  for (;;) {
    {
      MutexLock l(&mu);
      if (std::find(seen.begin(), seen.end(), "new") != seen.end() || d.expired()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  w.Stop();
  MutexLock l(&mu);
  EXPECT_NE(std::find(seen.begin(), seen.end(), "new"), seen.end());
  EXPECT_EQ(std::find(seen.begin(), seen.end(), "old"), seen.end());
}

// A lease's keys survive a restart with data while it is kept alive, and go
// away once it is no longer kept alive (etcd restarts the TTL on restart).
TEST_F(EtcdFaultTest, LeaseOutlivesARestartWhenKeptAliveThenExpires) {
  auto lease = store_->GrantLease(1, Soon());
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(store_->Set("/node/a", "up", Soon(), *lease).ok());
  etcd_->Kill();
  ASSERT_TRUE(etcd_->Restart(/*keep_data=*/true, Deadline::AfterSeconds(30)).ok());
  ASSERT_TRUE(store_->KeepAlive(*lease, Soon()).ok());
  EXPECT_TRUE(store_->Get("/node/a", Soon()).ok());
  Deadline d = Soon();
  while (store_->Get("/node/a", Soon()).ok() && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(store_->Get("/node/a", Soon()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->KeepAlive(*lease, Soon()).code(), StatusCode::kNotFound);
}

// etcd with authentication enabled: no credentials and a wrong password are
// refused and name the problem; the right user and password work, from the
// environment (MEMENTO_ETCD_USER / MEMENTO_ETCD_PASSWORD) as agents get them.
TEST_F(EtcdFaultTest, UserAndPasswordWhenAuthenticationIsEnabled) {
  auto etcdctl = FindExecutable("etcdctl");
  if (!etcdctl.ok()) GTEST_SKIP() << "no etcdctl (Debian etcd-client)";
  const std::string endpoint = "--endpoints=" + etcd_->url().replace(0, 7, "http://");
  for (std::vector<std::string> args : {std::vector<std::string>{"user", "add", "root:s3cret"},
                                        std::vector<std::string>{"auth", "enable"}}) {
    SpawnOptions o;
    o.argv = {*etcdctl, endpoint};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.log_path = dir_.path() + "/etcdctl.log";
    auto p = Subprocess::Spawn(o);
    ASSERT_TRUE(p.ok()) << p.status();
    auto st = p->Wait(Soon());
    ASSERT_TRUE(st.ok() && st->ok()) << TailFile(o.log_path);
  }
  auto none = OpenStore(etcd_->url(), "", Soon());
  EXPECT_FALSE(none.ok());
  setenv("MEMENTO_ETCD_USER", "root", 1);
  setenv("MEMENTO_ETCD_PASSWORD", "wrong", 1);
  auto wrong = OpenStore(etcd_->url(), "", Soon());
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied) << wrong.status();
  EXPECT_NE(wrong.status().message().find("MEMENTO_ETCD_PASSWORD"), std::string::npos);
  setenv("MEMENTO_ETCD_PASSWORD", "s3cret", 1);
  auto right = OpenStore(etcd_->url(), "", Soon());
  unsetenv("MEMENTO_ETCD_USER");
  unsetenv("MEMENTO_ETCD_PASSWORD");
  ASSERT_TRUE(right.ok()) << right.status();
  ASSERT_TRUE((*right)->Set("/auth/k", "v", Soon()).ok());
  EXPECT_EQ((*right)->Get("/auth/k", Soon())->value, "v");
}

}  // namespace
}  // namespace memento::coord
