#include "data.h"

#include <cmath>

namespace memento::trainer {
namespace {
// Probabilities of the kSuccessors likely successors; the rest (kNoise) is
// spread uniformly over the whole vocabulary.
constexpr double kSuccessorProb[MarkovCorpus::kSuccessors] = {0.55, 0.25, 0.1, 0.05};
constexpr double kNoise = 0.05;
}  // namespace

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Rng::Next() {
  if (state == 0) state = 0x9e3779b97f4a7c15ULL;
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return state * 0x2545f4914f6cdd1dULL;
}

double Rng::Normal() {
  double u1 = Uniform();
  double u2 = Uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

MarkovCorpus::MarkovCorpus(int vocab, uint64_t seed) : vocab_(vocab), next_(vocab * kSuccessors) {
  Rng rng{Mix64(seed ^ 0x6d61726b6f76ULL)};
  for (int a = 0; a < vocab; ++a) {
    for (int k = 0; k < kSuccessors; ++k) {
      next_[a * kSuccessors + k] = static_cast<int32_t>(rng.Next() % vocab);
    }
  }
}

void MarkovCorpus::Sequence(uint64_t key, int len, int32_t* out) const {
  Rng rng{Mix64(key)};
  int32_t tok = static_cast<int32_t>(rng.Next() % vocab_);
  for (int i = 0; i < len; ++i) {
    out[i] = tok;
    double u = rng.Uniform();
    int32_t nxt = -1;
    for (int k = 0; k < kSuccessors; ++k) {
      if (u < kSuccessorProb[k]) {
        nxt = next_[tok * kSuccessors + k];
        break;
      }
      u -= kSuccessorProb[k];
    }
    if (nxt < 0) nxt = static_cast<int32_t>(rng.Next() % vocab_);
    tok = nxt;
  }
}

void MarkovCorpus::NextBatch(DataCursor* cursor, int global_batch, int first, int count, int seq,
                             int32_t* tokens) const {
  Rng rng{cursor->rng_state};
  uint64_t step_key = rng.Next();
  for (int i = 0; i < count; ++i) {
    uint64_t index = cursor->sequences + static_cast<uint64_t>(first + i);
    Sequence(step_key ^ Mix64(index), seq + 1, tokens + static_cast<size_t>(i) * (seq + 1));
  }
  cursor->rng_state = rng.state;
  cursor->sequences += static_cast<uint64_t>(global_batch);
}

double MarkovCorpus::EntropyRate() const {
  // Per-token distribution: successor k with kSuccessorProb[k] plus kNoise /
  // vocab on every token (successor collisions ignored: an upper bound).
  double h = 0.0;
  double uniform = kNoise / vocab_;
  for (double p : kSuccessorProb) h -= (p + uniform) * std::log(p + uniform);
  h -= (vocab_ - kSuccessors) * uniform * std::log(uniform);
  return h;
}

DataCursor InitialCursor(uint64_t seed) {
  DataCursor c;
  c.rng_state = Mix64(seed ^ 0x64617461ULL) | 1;
  c.sequences = 0;
  return c;
}

}  // namespace memento::trainer
