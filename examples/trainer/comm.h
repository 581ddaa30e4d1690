// Process groups of a DP x TP x PP job over Gloo (TCP on 127.0.0.1,
// rendezvous through Gloo's FileStore in a shared directory).
//
// Rank order is Megatron's: TP fastest, then DP, then PP:
//   rank = (pp_rank * dp + dp_rank) * tp + tp_rank.
// Each rank joins three groups: its DP group (same pp, tp), its TP group
// (same pp, dp) and its PP group (same dp, tp; point-to-point between
// neighbouring stages). A world of one needs no Gloo at all.
//
// Errors from Gloo (exceptions: timeouts, a dead peer) are caught here and
// returned as Status.
//
// Thread safety: none; one trainer thread uses a Comm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memento/status.h"

namespace memento::trainer {

struct Topology {
  int dp = 1, tp = 1, pp = 1;
  int world() const { return dp * tp * pp; }
  int Rank(int dp_rank, int tp_rank, int pp_rank) const {
    return (pp_rank * dp + dp_rank) * tp + tp_rank;
  }
};

struct CommOptions {
  Topology topology;
  int rank = 0;
  std::string rendezvous_dir;  // shared by all ranks; required when world > 1
  // Names this attempt's keys in the rendezvous directory: a restarted job
  // that reuses the directory needs a new run id (stale keys of an earlier
  // attempt would be read otherwise). Letters, digits, '-' and '_'.
  std::string run_id = "0";
  double timeout_s = 120.0;  // for every collective and receive
};

class Comm {
 public:
  // Connects the world group, then this rank's DP, TP and PP groups. Every
  // rank of a job calls Create or Reconnect under the same run id: both
  // agree over the world group on which groups are kept (below).
  static Result<std::unique_ptr<Comm>> Create(const CommOptions& options);
  ~Comm();

  // In-process reconnection (docs/swift.md): replaces `old` by a Comm under
  // the new run id of `options`. Of `old`'s groups, those `offer` names are
  // offered for keeping; the others (and the world group, which holds the
  // lost rank) are closed first, so that a peer blocked in one fails at
  // once. Then the world group is connected anew and its ranks vote: a DP,
  // TP or PP group is kept iff every member offers it at the same `step` (a
  // replacement, a Create, offers none), and only the groups not kept are
  // connected again. The caller offers only groups it knows quiescent: no
  // operation on them failed or is pending, no peer can be blocked in one.
  struct Offer {
    bool dp = false, tp = false, pp = false;
    int64_t step = -1;  // the step the groups were quiescent after
  };
  static Result<std::unique_ptr<Comm>> Reconnect(const CommOptions& options,
                                                 std::unique_ptr<Comm> old, Offer offer);
  // The groups this Comm took over from the one it replaced (e.g.
  // "pp.dp0.tp0"); empty when it connected all of them.
  const std::vector<std::string>& kept_groups() const { return kept_; }

  const Topology& topology() const { return options_.topology; }
  int rank() const { return options_.rank; }
  int dp_rank() const { return dp_rank_; }
  int tp_rank() const { return tp_rank_; }
  int pp_rank() const { return pp_rank_; }

  // In-place sums.
  [[nodiscard]] Status AllreduceDp(float* data, size_t count);
  [[nodiscard]] Status AllreduceDp(double* data, size_t count);
  [[nodiscard]] Status AllreduceTp(float* data, size_t count);
  [[nodiscard]] Status AllreduceWorld(double* data, size_t count);
  // The commit round after the gradient-norm sum (docs/swift.md, "A rank
  // lost inside the gradient-norm sum"): every rank sends a token to every
  // other rank of the world, then waits for all of theirs. No rank leaves it
  // before every rank has entered it, so a rank that fails before sending
  // its token knows no rank passed. Fault injection: with `send_to` >= 0
  // the token goes only to the first `send_to` other ranks (in rank order);
  // the call still receives every other rank's token before it returns.
  [[nodiscard]] Status CommitWorld(int send_to = -1);
  // In-place minimum over the world (update-undo: the last step every rank
  // completed).
  [[nodiscard]] Status AllreduceWorldMin(double* data, size_t count);
  // Copies `bytes` bytes at `data` from DP rank `root` to the other ranks of
  // the DP group (replication-based recovery: a replica's state to the rank
  // that replaces a lost one).
  [[nodiscard]] Status BroadcastDp(void* data, size_t bytes, int root);
  // data holds dp * shard floats; DP rank r contributes [r * shard, (r + 1) *
  // shard) and afterwards every rank holds all of them.
  [[nodiscard]] Status AllgatherDp(float* data, size_t shard);

  // Point-to-point with another stage of this rank's PP group. Send starts
  // the transfer and returns; `data` must stay untouched until WaitSends.
  [[nodiscard]] Status SendStage(int stage, const float* data, size_t count, uint64_t tag);
  [[nodiscard]] Status WaitSends();
  // Blocks until the message has arrived.
  [[nodiscard]] Status RecvStage(int stage, float* data, size_t count, uint64_t tag);

  [[nodiscard]] Status Barrier();

  // Gives up on the sends still in flight (after a failure: a dead peer
  // never takes them) instead of waiting for them, so the Comm can be
  // destroyed at once; its peers' pending calls then fail.
  void AbandonSends();

 private:
  struct Impl;
  explicit Comm(const CommOptions& options);

  CommOptions options_;
  int dp_rank_ = 0, tp_rank_ = 0, pp_rank_ = 0;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> kept_;
};

}  // namespace memento::trainer
