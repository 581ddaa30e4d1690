#include "comm.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <vector>

namespace memento::trainer {

struct Comm::Impl {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::Context> world, dp, tp, pp;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> pending_sends;
  std::chrono::milliseconds timeout{120000};
  uint32_t tag = 0;  // collective tags, same sequence on every rank of a group
};

namespace {

// Runs a Gloo call and turns its exceptions into a Status.
template <typename F>
Status Guard(const char* what, F&& f) {
  try {
    f();
    return Status::Ok();
  } catch (const std::exception& e) {
    return UnavailableError(std::string(what) + ": " + e.what());
  }
}

template <typename T>
void SumInPlace(const std::shared_ptr<gloo::Context>& ctx, T* data, size_t count, uint32_t tag,
                std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(data, count);
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

}  // namespace

Comm::Comm(const CommOptions& options) : options_(options), impl_(std::make_unique<Impl>()) {
  const Topology& t = options.topology;
  tp_rank_ = options.rank % t.tp;
  dp_rank_ = (options.rank / t.tp) % t.dp;
  pp_rank_ = options.rank / (t.tp * t.dp);
}

Comm::~Comm() {
  if (impl_ && !impl_->pending_sends.empty()) WaitSends().IgnoreError();
}

Result<std::unique_ptr<Comm>> Comm::Create(const CommOptions& options) {
  return Reconnect(options, nullptr, Offer{});
}

Result<std::unique_ptr<Comm>> Comm::Reconnect(const CommOptions& options, std::unique_ptr<Comm> old,
                                              Offer offer) {
  const Topology& t = options.topology;
  if (t.dp < 1 || t.tp < 1 || t.pp < 1) {
    return InvalidArgumentError("topology sizes must be >= 1");
  }
  if (options.rank < 0 || options.rank >= t.world()) {
    return InvalidArgumentError("rank " + std::to_string(options.rank) + " outside world of " +
                                std::to_string(t.world()));
  }
  for (char ch : options.run_id) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') {
      return InvalidArgumentError("run id '" + options.run_id +
                                  "' may hold only letters, digits, '-' and '_'");
    }
  }
  std::unique_ptr<Comm> comm(new Comm(options));
  if (t.world() == 1) return comm;
  if (options.rendezvous_dir.empty()) {
    return InvalidArgumentError("world size " + std::to_string(t.world()) +
                                " needs a rendezvous directory");
  }
  Impl& impl = *comm->impl_;
  impl.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  const int dp = comm->dp_rank_, tp = comm->tp_rank_, pp = comm->pp_rank_;
  // The groups offered for keeping; everything else of `old` is closed now
  // (pending sends abandoned), so peers blocked on this rank fail at once.
  std::shared_ptr<gloo::Context> offered[3];
  if (old) {
    old->AbandonSends();
    if (offer.dp) offered[0] = std::move(old->impl_->dp);
    if (offer.tp) offered[1] = std::move(old->impl_->tp);
    if (offer.pp) offered[2] = std::move(old->impl_->pp);
    impl.device = old->impl_->device;  // the kept groups' pairs live on it
    old.reset();
  }
  // This rank's DP, TP and PP group: name and index among all groups of the
  // topology (DP groups, then TP groups, then PP groups).
  const std::string names[3] = {"dp.pp" + std::to_string(pp) + ".tp" + std::to_string(tp),
                                "tp.pp" + std::to_string(pp) + ".dp" + std::to_string(dp),
                                "pp.dp" + std::to_string(dp) + ".tp" + std::to_string(tp)};
  const int sizes[3] = {t.dp, t.tp, t.pp};
  const int index[3] = {pp * t.tp + tp, t.pp * t.tp + pp * t.dp + dp,
                        t.pp * t.tp + t.pp * t.dp + dp * t.tp + tp};
  const int groups = t.pp * t.tp + t.pp * t.dp + t.dp * t.tp;
  bool keep[3] = {false, false, false};
  Status st = Guard("gloo rendezvous", [&] {
    if (!impl.device) {
      gloo::transport::tcp::attr attr;
      // Under `memento launch --netns` each node has its own network
      // namespace (its own loopback): listen on the node's address so peers
      // can connect.
      const char* node_addr = std::getenv("MEMENTO_NODE_ADDR");
      attr.hostname = node_addr != nullptr && *node_addr != '\0' ? node_addr : "127.0.0.1";
      impl.device = gloo::transport::tcp::CreateDevice(attr);
    }
    gloo::rendezvous::FileStore store(options.rendezvous_dir);
    auto connect = [&](const std::string& name, int rank, int size) {
      gloo::rendezvous::PrefixStore prefixed("run" + options.run_id + "." + name, store);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
      ctx->setTimeout(impl.timeout);
      ctx->connectFullMesh(prefixed, impl.device);
      return std::static_pointer_cast<gloo::Context>(ctx);
    };
    impl.world = connect("world", options.rank, t.world());
    // The vote: per group, min over the ranks of (offered, step, -step); a
    // rank outside a group does not lower it.
    std::vector<double> vote(3 * static_cast<size_t>(groups), 1e18);
    for (int g = 0; g < 3; ++g) {
      const size_t i = static_cast<size_t>(index[g]);
      vote[i] = offered[g] ? 1.0 : 0.0;
      vote[groups + i] = static_cast<double>(offer.step);
      vote[2 * groups + i] = -static_cast<double>(offer.step);
    }
    gloo::AllreduceOptions opts(impl.world);
    opts.setOutput(vote.data(), vote.size());
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::min<double>));
    opts.setTag(9);
    opts.setTimeout(impl.timeout);
    gloo::allreduce(opts);
    for (int g = 0; g < 3; ++g) {
      const size_t i = static_cast<size_t>(index[g]);
      keep[g] =
          sizes[g] > 1 && offered[g] && vote[i] >= 1.0 && vote[groups + i] == -vote[2 * groups + i];
      if (!keep[g]) offered[g].reset();  // every member votes the same way
    }
    std::shared_ptr<gloo::Context>* slot[3] = {&impl.dp, &impl.tp, &impl.pp};
    const int ranks[3] = {dp, tp, pp};
    for (int g = 0; g < 3; ++g) {
      if (sizes[g] <= 1) continue;
      if (keep[g]) {
        *slot[g] = std::move(offered[g]);
        comm->kept_.push_back(names[g]);
      } else {
        *slot[g] = connect(names[g], ranks[g], sizes[g]);
      }
    }
  });
  if (!st.ok()) return st;
  return comm;
}

Status Comm::AllreduceDp(float* data, size_t count) {
  if (!impl_->dp) return Status::Ok();
  return Guard("dp allreduce", [&] { SumInPlace(impl_->dp, data, count, 1, impl_->timeout); });
}

Status Comm::AllreduceDp(double* data, size_t count) {
  if (!impl_->dp) return Status::Ok();
  return Guard("dp allreduce", [&] { SumInPlace(impl_->dp, data, count, 2, impl_->timeout); });
}

Status Comm::AllreduceTp(float* data, size_t count) {
  if (!impl_->tp) return Status::Ok();
  return Guard("tp allreduce", [&] { SumInPlace(impl_->tp, data, count, 3, impl_->timeout); });
}

Status Comm::AllreduceWorld(double* data, size_t count) {
  if (!impl_->world) return Status::Ok();
  return Guard("world allreduce",
               [&] { SumInPlace(impl_->world, data, count, 6, impl_->timeout); });
}

Status Comm::AllreduceWorldMin(double* data, size_t count) {
  if (!impl_->world) return Status::Ok();
  return Guard("world allreduce", [&] {
    gloo::AllreduceOptions opts(impl_->world);
    opts.setOutput(data, count);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::min<double>));
    opts.setTag(7);
    opts.setTimeout(impl_->timeout);
    gloo::allreduce(opts);
  });
}

Status Comm::CommitWorld(int send_to) {
  if (!impl_->world) return Status::Ok();
  return Guard("world commit", [&] {
    // A slot of its own (Gloo's collectives use prefixes 0x01..0x08).
    const uint64_t slot = static_cast<uint64_t>(gloo::Slot::build(0x4d, 1));
    const int n = options_.topology.world(), me = options_.rank;
    uint8_t token = 1;
    std::vector<uint8_t> in(static_cast<size_t>(n), 0);
    auto out = impl_->world->createUnboundBuffer(&token, 1);
    auto got = impl_->world->createUnboundBuffer(in.data(), in.size());
    for (int r = 0; r < n; ++r) {
      if (r != me) got->recv(r, slot, static_cast<size_t>(r), 1);
    }
    int sent = 0;
    for (int r = 0; r < n && (send_to < 0 || sent < send_to); ++r) {
      if (r == me) continue;
      out->send(r, slot);
      ++sent;
    }
    for (int i = 0; i < sent; ++i) {
      if (!out->waitSend(impl_->timeout)) throw std::runtime_error("commit send aborted");
    }
    // (Under fault injection too: a process that dies with unread data
    // resets its connections, and a peer may then lose the token it sent.)
    for (int i = 0; i < n - 1; ++i) {
      if (!got->waitRecv(impl_->timeout)) throw std::runtime_error("commit recv aborted");
    }
  });
}

Status Comm::BroadcastDp(void* data, size_t bytes, int root) {
  if (!impl_->dp) return Status::Ok();
  return Guard("dp broadcast", [&] {
    gloo::BroadcastOptions opts(impl_->dp);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root);
    opts.setTag(8);
    opts.setTimeout(impl_->timeout);
    gloo::broadcast(opts);
  });
}

Status Comm::AllgatherDp(float* data, size_t shard) {
  if (!impl_->dp) return Status::Ok();
  return Guard("dp allgather", [&] {
    const int d = options_.topology.dp;
    std::vector<float> mine(data + shard * dp_rank_, data + shard * (dp_rank_ + 1));
    gloo::AllgathervOptions opts(impl_->dp);
    opts.setInput(mine.data(), shard);
    opts.setOutput(data, std::vector<size_t>(d, shard));
    opts.setTag(4);
    opts.setTimeout(impl_->timeout);
    gloo::allgatherv(opts);
  });
}

Status Comm::SendStage(int stage, const float* data, size_t count, uint64_t tag) {
  return Guard("pipeline send", [&] {
    auto buf = impl_->pp->createUnboundBuffer(const_cast<float*>(data), count * sizeof(float));
    buf->send(stage, tag);
    impl_->pending_sends.push_back(std::move(buf));
  });
}

Status Comm::WaitSends() {
  Status st = Guard("pipeline send", [&] {
    for (auto& buf : impl_->pending_sends) {
      if (!buf->waitSend(impl_->timeout)) throw std::runtime_error("send aborted");
    }
  });
  impl_->pending_sends.clear();
  return st;
}

Status Comm::RecvStage(int stage, float* data, size_t count, uint64_t tag) {
  return Guard("pipeline recv", [&] {
    auto buf = impl_->pp->createUnboundBuffer(data, count * sizeof(float));
    buf->recv(stage, tag);
    if (!buf->waitRecv(impl_->timeout)) throw std::runtime_error("recv aborted");
  });
}

void Comm::AbandonSends() {
  // The pairs refer to unbound buffers through weak pointers: dropping ours
  // cancels them.
  impl_->pending_sends.clear();
}

Status Comm::Barrier() {
  if (!impl_->world) return Status::Ok();
  return Guard("barrier", [&] {
    gloo::BarrierOptions opts(impl_->world);
    opts.setTag(5);
    opts.setTimeout(impl_->timeout);
    gloo::barrier(opts);
  });
}

}  // namespace memento::trainer
