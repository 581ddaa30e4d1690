// The agent-to-agent (and launcher-to-agent) protocol: RPC methods served by
// every agent's peer service over the authenticated transport (src/net, job
// token, mutual HMAC). docs/cluster.md has the whole flow.
//
// Bodies are JSON unless said otherwise. Errors travel as the RPC's Status.
#pragma once

#include <cstdint>

namespace memento::net {

enum PeerMethod : uint32_t {
  // {"verify": bool} -> recover::NodeInventory (ToJson). With verify, T0 slots
  // and redundancy entries are checksummed before they are listed.
  kPeerInventory = 0x4d450001,
  // recover::ReadRequest (ToJson) -> the raw bytes (reply body, sent from
  // shared memory without a copy; the caller receives them with CallInto).
  // NotFound when this node does not hold them, DataLoss on a bad checksum.
  kPeerRead = 0x4d450002,
  // Body: u32 little-endian n, n bytes of JSON {"step", "copy", "offset",
  // "total"}, then the payload: bytes [offset, offset + payload) of plan Copy
  // `copy` of version `step` (a Gemini peer copy, or an AOR copy shipped as
  // one). The receiver writes them into its redundancy store; when `offset +
  // payload == total` the entry is finished (checksummed). Reply: "{}".
  kPeerPush = 0x4d450003,
  // {"step", "plan_hash", "assemblies": [...]} -> {"ranks": [...],
  // "bytes", "transfer_s", "decode_s", "write_s", "total_s"}: rebuild the T0
  // slots of the listed ranks on this node at version `step`
  // (recover::ExecuteAssemblies), leaving them complete and verified.
  kPeerRecover = 0x4d450004,
  // {"step"[, "epoch"]} -> "{}": the cluster restores `step` (the recovery's
  // decision); the agent answers its trainers' restore-target query with it
  // and keeps that version until a newer one commits. With "epoch" (> 0, the
  // commit epoch the job's history restarts in, coord::CommitId) the agent
  // takes `step` as its newest commit at once and reports the steps trained
  // after it in that epoch.
  kPeerSetRestoreTarget = 0x4d450005,
  // recover::ReadRequest (ToJson) -> a stream (net::RpcServer::RegisterStream):
  // the bytes as kFrameFlagDigest data frames sent straight from shared
  // memory, then an empty reply. T0 pieces go out chunk by chunk with the
  // slot table's checksum as digest (the receiver checks the bytes against
  // the checksum the trainer's copy computed), then the slot's generation is
  // re-checked: Aborted in the reply when it was overwritten meanwhile (the
  // caller discards the data). Copies and parities go out in parts of at
  // most kPeerStreamPartBytes, hashed as they are sent. Errors as kPeerRead.
  // The recovery data path (ClusterReader); docs/peer_service.md.
  kPeerReadStream = 0x4d450010,
  // {"dir", "step"[, "epoch"]} -> agent::DurableLoadStats (JSON): every rank the plan
  // places on this node is read from the complete durable version `step`
  // under `dir` into a complete, verified T0 slot of `step`
  // (agent::LoadDurableVersion), then `step` becomes the restore target (as
  // with kPeerSetRestoreTarget). FailedPrecondition "no plan yet" from an
  // agent that has not computed the plan (retry); NotFound when the version
  // is not complete or lacks a tensor of a rank.
  kPeerLoadDurable = 0x4d450006,
  // The survivors' deferred verification of a recovery (docs/recovery.md,
  // "The survivors' verification"). {"step", "phase": "begin"} -> "{}":
  // starts hashing, on threads of the service, every chunk of this node's
  // complete T0 slots of `step` that lies outside the pieces this node
  // serves, and every redundancy entry of `step`; from then on the whole
  // chunks this node streams with their table checksum (kPeerReadStream) are
  // counted as checked by their receiver. {"step", "phase": "finish"} ->
  // {"hashed_bytes", "trusted_bytes", "slots"}: waits for that pass, then
  // hashes the chunks of the served pieces that were not streamed whole;
  // DataLoss naming the slot and chunk (or the entry) when anything fails its
  // checksum, Aborted when a slot was rewritten meanwhile, FailedPrecondition
  // when no "begin" of `step` came before. {"step", "phase": "discard",
  // "ranks": [...]} -> {"discarded": [...]}: the complete slots of `step` of
  // those ranks (just rebuilt here from inputs a failed check no longer
  // vouches for) are left torn (kWriting, a new generation).
  kPeerVerifyKept = 0x4d450007,
};

}  // namespace memento::net
