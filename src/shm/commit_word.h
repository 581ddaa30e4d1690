// The commit word: a small shared-memory file, <root>/commit.word, that an
// agent in cluster mode (docs/cluster.md) writes and its trainers read, so
// that a trainer never overwrites the node's T0 slot of the newest globally
// committed version, nor a newer version the agent is still protecting.
//
//   committed   newest step committed by the whole cluster (-1: none)
//   hold        the step whose T0 slots the agent is reading to produce its
//               redundancy (T1), or has reported COMPLETED and waits to see
//               committed; -1: none
//   generation  incremented by every agent update (diagnostics, tests)
//   durable_hold  1 + the step whose T0 slots the agent's durable stream is
//               writing (or will write next) to the durable tier; 0: none.
//               Stored off by one so that a word written by an agent that
//               predates the field (reserved bytes zero) means "no hold".
//   durable_hold_deadline_ns  CLOCK_MONOTONIC time after which the durable
//               hold no longer binds the trainers (the agent's
//               --durable-hold-max-s): a slow disk, or an agent that died
//               holding, cannot stop in-memory protection for long. The
//               agent stores the deadline before the hold, so a client that
//               loads a hold loads its deadline (or a later one) after it.
//   claim[r]    written by rank r's client: the step it is about to overwrite
//               in its target slot (-1: none). Dekker-style handshake with
//               `hold` (both sides store, full fence, load the other's word):
//               either the client sees hold == that step and skips its
//               snapshot, or the agent sees the claim and abandons the step,
//               or both back off; never both proceed. The same claim
//               answers both holds (`hold` and `durable_hold`).
//
// The file <root>/commit.word exists only in cluster mode: without it the
// client keeps the single-node rule (overwrite the slot that does not hold the
// newest complete version). An agent with a durable tier and no cluster
// creates <root>/durable.word instead, with the same layout, in which only
// durable_hold, its deadline and the claims are used (docs/durable_tier.md,
// "The durable hold"). All fields are 8-byte aligned and accessed atomically.
//
// Thread safety: free functions over shared memory; one agent writes
// committed/hold/generation, each rank writes only its own claim entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>
#include <type_traits>

namespace memento::shm {

inline constexpr uint64_t kCommitWordMagic = 0x31574d434d454dULL;  // "MEMCMW1"
inline constexpr uint32_t kCommitWordVersion = 1;
// Ranks (global ids) that can claim; a rank >= this has no claim entry and
// never overwrites a slot the agent may be holding (it skips instead).
inline constexpr int kCommitWordMaxRanks = 4096;

struct CommitWord {
  uint64_t magic;
  uint32_t version;
  uint32_t pad0;
  int64_t committed;
  int64_t hold;
  uint64_t generation;
  int64_t durable_hold;              // step + 1; 0: none
  int64_t durable_hold_deadline_ns;  // CLOCK_MONOTONIC
  uint64_t reserved[1];
  int64_t claim[kCommitWordMaxRanks];
};
static_assert(std::is_trivially_copyable_v<CommitWord>);
static_assert(std::is_standard_layout_v<CommitWord>);
static_assert(offsetof(CommitWord, committed) == 16);
static_assert(offsetof(CommitWord, hold) == 24);
static_assert(offsetof(CommitWord, generation) == 32);
static_assert(offsetof(CommitWord, durable_hold) == 40);
static_assert(offsetof(CommitWord, durable_hold_deadline_ns) == 48);
static_assert(offsetof(CommitWord, claim) == 64);
static_assert(sizeof(CommitWord) == 64 + 8 * kCommitWordMaxRanks,
              "CommitWord layout is part of the format");

inline std::string CommitWordPath(const std::string& root) { return root + "/commit.word"; }
// The single-node agent's hold word (same layout; only the durable hold and
// the claims are used).
inline std::string DurableWordPath(const std::string& root) { return root + "/durable.word"; }

inline int64_t LoadWord(const int64_t* w) { return __atomic_load_n(w, __ATOMIC_SEQ_CST); }
inline void StoreWord(int64_t* w, int64_t v) { __atomic_store_n(w, v, __ATOMIC_SEQ_CST); }
inline void FullFence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// CLOCK_MONOTONIC in nanoseconds: the same clock in every process of a host.
inline int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The step the durable hold protects, or -1 (none, or its deadline passed).
inline int64_t LoadDurableHold(const CommitWord* w, int64_t now_ns) {
  const int64_t h = __atomic_load_n(&w->durable_hold, __ATOMIC_SEQ_CST);
  if (h <= 0) return -1;
  if (now_ns >= __atomic_load_n(&w->durable_hold_deadline_ns, __ATOMIC_SEQ_CST)) return -1;
  return h - 1;
}

// Agent: holds `step` (-1: releases) until `deadline_ns`. The caller then
// fences and reads the claims (Dekker handshake, see above).
inline void StoreDurableHold(CommitWord* w, int64_t step, int64_t deadline_ns) {
  if (step < 0) {
    __atomic_store_n(&w->durable_hold, 0, __ATOMIC_SEQ_CST);
    return;
  }
  __atomic_store_n(&w->durable_hold_deadline_ns, deadline_ns, __ATOMIC_SEQ_CST);
  __atomic_store_n(&w->durable_hold, step + 1, __ATOMIC_SEQ_CST);
}

// Initialises a fresh (all-zero) or reused word. Agent only.
inline void InitCommitWord(CommitWord* w, int64_t committed) {
  __atomic_store_n(&w->version, kCommitWordVersion, __ATOMIC_RELAXED);
  StoreWord(&w->committed, committed);
  StoreWord(&w->hold, -1);
  StoreDurableHold(w, -1, 0);
  for (int r = 0; r < kCommitWordMaxRanks; ++r) {
    // Claims of a dead client are stale: a live one re-claims before writing.
    StoreWord(&w->claim[r], -1);
  }
  __atomic_add_fetch(&w->generation, 1, __ATOMIC_SEQ_CST);
  __atomic_store_n(&w->magic, kCommitWordMagic, __ATOMIC_RELEASE);
}

inline bool CommitWordValid(const CommitWord* w) {
  return __atomic_load_n(&w->magic, __ATOMIC_ACQUIRE) == kCommitWordMagic &&
         __atomic_load_n(&w->version, __ATOMIC_RELAXED) == kCommitWordVersion;
}

}  // namespace memento::shm
