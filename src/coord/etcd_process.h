// EtcdProcess: a real, single-member etcd server on loopback, for the tests,
// `memento bench store` and `memento demo --store etcd` (docs/etcd.md).
//
//   auto etcd = EtcdProcess::Start(dir, Deadline::AfterSeconds(20));
//   if (etcd.status().code() == StatusCode::kNotFound) GTEST_SKIP();  // no etcd binary
//   auto store = OpenStore((*etcd)->url(), "", deadline);
//   (*etcd)->Kill();                    // kill -9
//   (*etcd)->Restart(/*keep_data=*/true, deadline);   // same ports, same data dir
//
// The server listens on two free loopback ports (client, peer), keeps its data
// in <dir>/etcd-data and logs to <dir>/etcd.log. Short raft timings (heartbeat
// 10 ms, election 100 ms) so it is ready in well under a second and etcd's
// minimum lease TTL is 1 s.
//
// Thread safety: one thread at a time.
#pragma once

#include <memory>
#include <string>

#include "common/subprocess.h"
#include "memento/deadline.h"
#include "memento/status.h"

namespace memento::coord {

class EtcdProcess {
 public:
  // Runs `binary` (a path, or a name looked up on PATH; empty: `etcd`), as
  // the caller's user named it (`memento bench`: MEMENTO_ETCD_BIN). NotFound
  // when there is no such binary. Unavailable when it does not answer
  // before the deadline (the message carries the tail of its log).
  [[nodiscard]] static Result<std::unique_ptr<EtcdProcess>> Start(const std::string& dir,
                                                                  Deadline deadline,
                                                                  const std::string& binary = "");
  ~EtcdProcess();

  // "etcd://127.0.0.1:<client port>".
  std::string url() const;
  int client_port() const { return client_port_; }
  const std::string& data_dir() const { return data_dir_; }
  const std::string& log_path() const { return log_path_; }
  bool running() { return proc_.running(); }

  // kill -9 and reap.
  void Kill();
  // Starts it again on the same ports, with its data (keep_data) or empty.
  [[nodiscard]] Status Restart(bool keep_data, Deadline deadline);

 private:
  EtcdProcess() = default;
  Status Launch(Deadline deadline);

  std::string binary_;
  std::string data_dir_;
  std::string log_path_;
  int client_port_ = 0;
  int peer_port_ = 0;
  Subprocess proc_;
};

}  // namespace memento::coord
