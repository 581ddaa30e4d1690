// T1 production of one version on one node (docs/cluster.md, "Save path of
// version s"): this node's redundancy entries computed from its own T0 slots
// (parities by the stripe's codec, ARC and local full copies; no network),
// and the peer / AOR copies other nodes hold of this node's pieces, pushed to
// their peer services (kPeerPush).
//
// Thread safety: not thread-safe; the job member's save-path thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "agent/redundancy.h"
#include "memento/status.h"
#include "net/job_token.h"
#include "net/rpc.h"
#include "shm/segment.h"
#include "shm/slot.h"
#include "topo/plan.h"

namespace memento::agent {

// A local rank's T0 slot of one version, as T1 production reads it.
struct RankSlotView {
  int rank = -1;
  int slot = -1;
  std::shared_ptr<shm::Segment> segment;
  shm::SlotInfo info;
};

class T1Producer {
 public:
  // `plan`, `redundancy` and `token` must outlive the producer.
  // `endpoint_of(node)` is a node's peer-service address (host:port).
  T1Producer(const topo::Plan* plan, int node, RedundancyStore* redundancy,
             const net::JobToken* token, std::function<Result<std::string>(int)> endpoint_of);

  // This node's parity entries and ARC / local full copies of `step`, read
  // from `views` (every local rank's slot of `step`), into the redundancy
  // store (RedundancyStore::Ensure(step) done by the caller).
  [[nodiscard]] Status ProduceEntries(int64_t step, const std::map<int, RankSlotView>& views);

  // Pushes every peer / AOR copy of this node's pieces of `step` to the node
  // that holds it (one connection per node, kept; a broken one is replaced
  // once). A receiver without a plan yet (FailedPrecondition) is tried again
  // while `keep_trying()` and the deadline (`timeout_s` per copy) allow.
  // `on_pushed(bytes)` after each copy. A kAor copy for which
  // `aor_held(copy, step)` is true is not pushed: its holder keeps it
  // current on the host (docs/reft.md section 5).
  [[nodiscard]] Status PushCopies(
      int64_t step, const std::map<int, RankSlotView>& views, double timeout_s,
      const std::function<bool()>& keep_trying, const std::function<void(uint64_t)>& on_pushed,
      const std::function<bool(uint32_t copy, int64_t step)>& aor_held = nullptr);

  // Bytes [offset, offset + n) of plan piece `piece`, read from `view`'s slot.
  [[nodiscard]] Status ReadPiece(const RankSlotView& view, uint32_t piece, uint64_t offset,
                                 uint64_t n, uint8_t* dst) const;

 private:
  const topo::Plan* plan_;
  int node_;
  RedundancyStore* red_;
  const net::JobToken* token_;
  std::function<Result<std::string>(int)> endpoint_of_;
  std::map<int, std::unique_ptr<net::RpcClient>> peers_;  // node -> connection
};

}  // namespace memento::agent
