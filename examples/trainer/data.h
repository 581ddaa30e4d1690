// A deterministic synthetic corpus generated in-process: a seeded first-order
// Markov language over the vocabulary. Each token has a few likely successors
// (and a small chance of a uniformly random one), so a model can learn it and
// the loss visibly falls from ln(vocab) towards the language's entropy.
//
// The data-loader position is two integers (an RNG state and a cursor, both
// part of the saved training state). A step's global batch is a pure
// function of (corpus seed, position), so every topology sees the same
// sequences: DP rank r of D takes sequences [r * B / D, (r + 1) * B / D).
#pragma once

#include <cstdint>
#include <vector>

namespace memento::trainer {

// SplitMix64 step: a strong 64-bit mixing function.
uint64_t Mix64(uint64_t x);

// A small counter-free generator (xorshift64*); state is one word.
struct Rng {
  uint64_t state;
  uint64_t Next();
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
  // Standard normal (Box-Muller, one value per call).
  double Normal();
};

// The data-loader position, saved with the training state.
struct DataCursor {
  uint64_t rng_state = 0;  // draws one key per step
  uint64_t sequences = 0;  // sequences consumed so far (global)
};

class MarkovCorpus {
 public:
  static constexpr int kSuccessors = 4;

  MarkovCorpus(int vocab, uint64_t seed);

  int vocab() const { return vocab_; }

  // Writes `len` tokens of the sequence identified by `key`.
  void Sequence(uint64_t key, int len, int32_t* out) const;

  // Fills tokens[count, seq + 1] with sequences [first, first + count) of the
  // next global batch and advances `cursor` past a global batch of
  // `global_batch` sequences. Inputs are row[0, seq), targets row[1, seq].
  void NextBatch(DataCursor* cursor, int global_batch, int first, int count, int seq,
                 int32_t* tokens) const;

  // Entropy rate (nats per token) of the language: the loss floor.
  double EntropyRate() const;

 private:
  int vocab_;
  std::vector<int32_t> next_;  // [vocab, kSuccessors]
};

// The initial data cursor for a seed.
DataCursor InitialCursor(uint64_t seed);

}  // namespace memento::trainer
