#include "agent/t1_producer.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "agent/peer_service.h"
#include "codec/erasure_code.h"
#include "fmt/format.h"
#include "net/socket.h"
#include "recover/source.h"

namespace memento::agent {

namespace {

constexpr size_t kEncodeChunkBytes = size_t{1} << 20;

}  // namespace

T1Producer::T1Producer(const topo::Plan* plan, int node, RedundancyStore* redundancy,
                       const net::JobToken* token,
                       std::function<Result<std::string>(int)> endpoint_of)
    : plan_(plan),
      node_(node),
      red_(redundancy),
      token_(token),
      endpoint_of_(std::move(endpoint_of)) {}

Status T1Producer::ReadPiece(const RankSlotView& view, uint32_t piece_id, uint64_t offset,
                             uint64_t n, uint8_t* dst) const {
  const topo::Piece& piece = plan_->pieces[piece_id];
  if (offset + n > piece.bytes) {
    return InternalError(
        fmt::format("read [{}, +{}) past piece {} ({} bytes)", offset, n, piece.key, piece.bytes));
  }
  const uint8_t* data = view.segment->data() + view.info.data_offset;
  uint64_t pos = 0;  // piece offset of the current segment
  for (const topo::Segment& s : piece.segments) {
    if (n == 0) break;
    if (offset < pos + s.length) {
      uint64_t in = offset - pos;
      uint64_t take = std::min(n, s.length - in);
      auto runs = shm::FindRange(view.info, s.tensor, s.offset + in, take);
      if (!runs.ok()) {
        return FailedPreconditionError(fmt::format("rank {} step {} (piece {}): {}", view.rank,
                                                   view.info.step, piece.key,
                                                   runs.status().message()));
      }
      for (const shm::SlotRun& r : *runs) {
        std::memcpy(dst, data + r.data_offset, r.length);
        dst += r.length;
      }
      offset += take;
      n -= take;
    }
    pos += s.length;
  }
  if (n != 0) return InternalError("piece segments shorter than the piece");
  return Status::Ok();
}

Status T1Producer::ProduceEntries(int64_t step, const std::map<int, RankSlotView>& views) {
  const topo::NodePlan& np = plan_->nodes[node_];
  auto view_of = [&](int rank) -> Result<const RankSlotView*> {
    auto it = views.find(rank);
    if (it == views.end()) {
      return InternalError(fmt::format("rank {} is not on node {}", rank, node_));
    }
    return &it->second;
  };
  for (uint32_t pid : np.parities) {
    const topo::Parity& par = plan_->parities[pid];
    const topo::Stripe& stripe = plan_->stripes[par.stripe];
    MEMENTO_ASSIGN_OR_RETURN(const RankSlotView* view, view_of(par.producer_rank));
    MEMENTO_ASSIGN_OR_RETURN(
        codec::ErasureCode code,
        codec::ErasureCode::Create(stripe.xor_code ? codec::CodeKind::kXor : codec::CodeKind::kRs,
                                   stripe.k, stripe.f));
    const recover::ByteSource id{recover::SourceKind::kParity, pid};
    // The client computed it (a parity entry of the producer's slot,
    // docs/reft.md section 4).
    const int entry = shm::FindParityEntry(view->info.tensors, pid);
    if (entry >= 0 && view->info.tensors[static_cast<size_t>(entry)].nbytes != stripe.block_bytes) {
      return DataLossError(
          fmt::format("rank {} step {}: parity {} holds {} bytes, the plan's is {}", view->rank,
                      view->info.step, pid, view->info.tensors[static_cast<size_t>(entry)].nbytes,
                      stripe.block_bytes));
    }
    MEMENTO_ASSIGN_OR_RETURN(std::optional<RedundancyStore::ResidentRef> resident,
                             red_->Resident(step, id));
    if (resident.has_value()) {
      // The version references the parity entry of the producer's slot
      // (its client said it writes one: RedundancyStore::SetClientParity):
      // nothing is copied.
      if (entry < 0 && resident->source.needs_client_entry()) {
        // It did not (a client that fell back to whole tensors after the
        // plan op): this version cannot be made; later ones keep the
        // parity in T1.
        red_->SetClientParity(par.producer_rank, -1, 0);
        return FailedPreconditionError(fmt::format(
            "rank {}'s slot of step {} holds no entry of parity {}, which its client said it "
            "writes; the parities of later versions are kept in T1",
            view->rank, view->info.step, pid));
      }
      MEMENTO_RETURN_IF_ERROR(red_->FinishResidentEntry(step, id, view->info.generation));
      continue;
    }
    MEMENTO_ASSIGN_OR_RETURN(uint8_t * out, red_->EntryBuffer(step, id));
    // Otherwise take the client's bytes from the slot when it has them, else
    // (whole-tensor slots, clients that leave parity to the agent) encode
    // from the slot's stripe inputs.
    if (entry >= 0) {
      const shm::SavedTensor& t = view->info.tensors[static_cast<size_t>(entry)];
      std::memcpy(out, view->segment->data() + view->info.data_offset + t.offset, t.nbytes);
      MEMENTO_RETURN_IF_ERROR(red_->FinishEntry(step, {recover::SourceKind::kParity, pid}));
      continue;
    }
    Status st = codec::EncodeStream(
        code, stripe.block_bytes, kEncodeChunkBytes,
        [&](size_t off, size_t n, uint8_t* const* chunks) -> Status {
          for (int i = 0; i < stripe.k; ++i) {
            const topo::StripeBlock& b = stripe.data[i];
            uint64_t have = off < b.length ? std::min<uint64_t>(n, b.length - off) : 0;
            if (have > 0) {
              MEMENTO_RETURN_IF_ERROR(ReadPiece(*view, b.piece, b.offset + off, have, chunks[i]));
            }
            if (have < n) std::memset(chunks[i] + have, 0, n - have);  // zero padding
          }
          return Status::Ok();
        },
        [&](size_t off, size_t n, const uint8_t* const* parity) -> Status {
          std::memcpy(out + off, parity[par.index], n);
          return Status::Ok();
        });
    MEMENTO_RETURN_IF_ERROR(st);
    MEMENTO_RETURN_IF_ERROR(red_->FinishEntry(step, {recover::SourceKind::kParity, pid}));
  }
  for (uint32_t cid : np.copies) {
    const topo::Copy& c = plan_->copies[cid];
    if (c.kind != topo::CopyKind::kArc && c.kind != topo::CopyKind::kLocalFull) continue;
    MEMENTO_ASSIGN_OR_RETURN(const RankSlotView* view, view_of(c.producer_rank));
    const recover::ByteSource entry{recover::SourceKind::kCopy, cid};
    MEMENTO_ASSIGN_OR_RETURN(std::optional<RedundancyStore::ResidentRef> resident,
                             red_->Resident(step, entry));
    if (resident.has_value()) {
      // The bytes already lie in the producer rank's slot of `step`: the
      // entry references them (docs/reft.md section 4), nothing is copied.
      if (resident->source.rank != c.producer_rank) {
        return InternalError(fmt::format("copy {} resident in rank {}, produced by rank {}", cid,
                                         resident->source.rank, c.producer_rank));
      }
      MEMENTO_RETURN_IF_ERROR(red_->FinishResidentEntry(step, entry, view->info.generation));
      continue;
    }
    MEMENTO_ASSIGN_OR_RETURN(uint8_t * out, red_->EntryBuffer(step, entry));
    MEMENTO_RETURN_IF_ERROR(ReadPiece(*view, c.piece, 0, plan_->pieces[c.piece].bytes, out));
    MEMENTO_RETURN_IF_ERROR(red_->FinishEntry(step, {recover::SourceKind::kCopy, cid}));
  }
  return Status::Ok();
}

Status T1Producer::PushCopies(int64_t step, const std::map<int, RankSlotView>& views,
                              double timeout_s, const std::function<bool()>& keep_trying,
                              const std::function<void(uint64_t)>& on_pushed,
                              const std::function<bool(uint32_t, int64_t)>& aor_held) {
  std::vector<uint8_t> buf;
  for (const topo::Copy& c : plan_->copies) {
    if (c.kind != topo::CopyKind::kPeer && c.kind != topo::CopyKind::kAor) continue;
    const topo::Piece& piece = plan_->pieces[c.piece];
    if (piece.node != node_) continue;
    // AOR: the holder recomputes this shard from its own gradients.
    if (c.kind == topo::CopyKind::kAor && aor_held && aor_held(c.id, step)) continue;
    auto it = views.find(piece.rank);
    if (it == views.end())
      return InternalError(fmt::format("piece {} has no local rank", piece.key));
    buf.resize(piece.bytes);
    MEMENTO_RETURN_IF_ERROR(ReadPiece(it->second, c.piece, 0, piece.bytes, buf.data()));
    Deadline deadline = Deadline::AfterSeconds(timeout_s);
    Status st;
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto& client = peers_[c.node];
      if (client == nullptr || client->broken()) {
        client.reset();
        MEMENTO_ASSIGN_OR_RETURN(std::string ep, endpoint_of_(c.node));
        MEMENTO_ASSIGN_OR_RETURN(net::HostPort hp, net::ParseHostPort(ep, net::PortUse::kConnect));
        auto conn = net::RpcClient::Connect(hp.host, hp.port, *token_, deadline);
        if (!conn.ok()) {
          st = conn.status();
          continue;
        }
        client = std::move(*conn);
      }
      st = PushCopy(*client, step, c.id, buf.data(), buf.size(), deadline);
      if (st.ok()) break;
      if (st.code() == StatusCode::kFailedPrecondition && !deadline.expired() && keep_trying()) {
        // The receiver has no plan yet (it is still waiting for the
        // inventories): try again shortly.
        usleep(20000);
        attempt = -1;
        continue;
      }
      // A broken connection (peer restarted) is retried once on a fresh one.
      if (!client->broken()) break;
    }
    if (!st.ok()) {
      return Status(st.code(), fmt::format("pushing copy {} of piece {} (step {}) to node {}: {}",
                                           c.id, piece.key, step, c.node, st.message()));
    }
    on_pushed(piece.bytes);
  }
  return Status::Ok();
}

}  // namespace memento::agent
