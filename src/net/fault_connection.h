// FaultInjectionConnection: a Connection wrapper for fault tests (STYLE.md:
// "a transport wrapper that drops or delays"). It forwards to a real
// connection and, per its FaultPlan, delays sends, silently drops sent frames,
// or cuts the connection after a number of frames.
//
// Thread safety: as the wrapped connection; the plan may be changed at any
// time through set_plan().
#pragma once

#include <chrono>
#include <memory>
#include <random>
#include <thread>

#include "common/mutex.h"
#include "net/connection.h"

namespace memento::net {

struct FaultPlan {
  // Each Send sleeps this long first.
  std::chrono::milliseconds send_delay{0};
  // Probability that a Send reports success but the frame never leaves.
  double drop_probability = 0.0;
  // After this many successful Sends the connection is shut down (-1 = never).
  int cut_after_sends = -1;
  uint64_t seed = 1;
};

class FaultInjectionConnection : public Connection {
 public:
  FaultInjectionConnection(std::unique_ptr<Connection> inner, FaultPlan plan)
      : inner_(std::move(inner)), plan_(plan), rng_(plan.seed) {}

  Status Send(FrameType type, uint32_t flags, const ConstBuffer* parts, size_t num_parts,
              Deadline deadline) override EXCLUDES(mu_) {
    bool drop = false;
    MEMENTO_RETURN_IF_ERROR(BeforeSend(&drop));
    if (drop) return Status::Ok();
    return inner_->Send(type, flags, parts, num_parts, deadline);
  }
  Status SendDigested(FrameType type, const ConstBuffer* parts, size_t num_parts, uint64_t digest,
                      Deadline deadline) override EXCLUDES(mu_) {
    bool drop = false;
    MEMENTO_RETURN_IF_ERROR(BeforeSend(&drop));
    if (drop) return Status::Ok();
    return inner_->SendDigested(type, parts, num_parts, digest, deadline);
  }
  using Connection::Send;
  Result<Frame> Recv(Deadline deadline) override { return inner_->Recv(deadline); }
  Result<Frame> RecvWith(const PayloadSink& sink, Deadline deadline) override {
    return inner_->RecvWith(sink, deadline);
  }
  Result<Frame> RecvSplit(void* head, size_t head_len, void* body, size_t body_cap,
                          size_t* body_len, Deadline deadline) override {
    return inner_->RecvSplit(head, head_len, body, body_cap, body_len, deadline);
  }
  void Shutdown() override { inner_->Shutdown(); }
  const std::string& peer() const override { return inner_->peer(); }

  void set_plan(const FaultPlan& plan) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    plan_ = plan;
  }
  int dropped() const { return dropped_.load(); }

 private:
  // Applies the plan to one send: delay, cut, or drop (*drop: report success
  // without sending).
  Status BeforeSend(bool* drop) EXCLUDES(mu_) {
    FaultPlan plan;
    {
      MutexLock l(&mu_);
      plan = plan_;
      *drop = std::uniform_real_distribution<double>(0, 1)(rng_) < plan.drop_probability;
    }
    if (plan.send_delay.count() > 0) std::this_thread::sleep_for(plan.send_delay);
    if (plan.cut_after_sends >= 0 && sends_.load() >= plan.cut_after_sends) {
      inner_->Shutdown();
      return UnavailableError("fault injection: connection cut");
    }
    sends_.fetch_add(1);
    if (*drop) dropped_.fetch_add(1);
    return Status::Ok();
  }

  std::unique_ptr<Connection> inner_;
  Mutex mu_;
  FaultPlan plan_ GUARDED_BY(mu_);
  std::mt19937_64 rng_ GUARDED_BY(mu_);
  std::atomic<int> sends_{0};
  std::atomic<int> dropped_{0};
};

}  // namespace memento::net
