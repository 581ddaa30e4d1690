#include "topo/save_ranges.h"

#include <algorithm>
#include <map>
#include <string>

#include "fmt/format.h"

namespace memento::topo {

namespace {

// Appends the segments of piece bytes [offset, offset + length) to `out`.
void PieceSubSegments(const Piece& piece, uint64_t offset, uint64_t length,
                      std::vector<Segment>* out) {
  uint64_t pos = 0;
  const uint64_t end = offset + length;
  for (const Segment& s : piece.segments) {
    const uint64_t lo = std::max(offset, pos), hi = std::min(end, pos + s.length);
    if (lo < hi) out->push_back(Segment{s.tensor, s.offset + (lo - pos), hi - lo});
    pos += s.length;
  }
}

}  // namespace

std::vector<std::vector<Segment>> StripeBlockSegments(const Plan& plan, const Stripe& stripe) {
  std::vector<std::vector<Segment>> out(stripe.data.size());
  for (size_t i = 0; i < stripe.data.size(); ++i) {
    const StripeBlock& b = stripe.data[i];
    if (b.length > 0) PieceSubSegments(plan.pieces[b.piece], b.offset, b.length, &out[i]);
  }
  return out;
}

Result<std::vector<Segment>> RankSaveRanges(const Plan& plan, int rank,
                                            const std::vector<TensorMeta>& tensors,
                                            bool parity_inputs) {
  if (rank < 0 || rank >= static_cast<int>(plan.ranks.size())) {
    return InvalidArgumentError(
        fmt::format("rank {} is not in the plan ({} ranks)", rank, plan.ranks.size()));
  }
  std::vector<Segment> wanted;
  for (const Piece& p : plan.pieces) {
    if (p.rank == rank) PieceSubSegments(p, 0, p.bytes, &wanted);
  }
  for (const Copy& c : plan.copies) {
    if (c.producer_rank != rank) continue;
    if (c.kind != CopyKind::kArc && c.kind != CopyKind::kLocalFull) continue;
    const Piece& p = plan.pieces[c.piece];
    PieceSubSegments(p, 0, p.bytes, &wanted);
  }
  for (const Parity& par : plan.parities) {
    if (par.producer_rank != rank || !parity_inputs) continue;
    for (const StripeBlock& b : plan.stripes[par.stripe].data) {
      if (b.length > 0) PieceSubSegments(plan.pieces[b.piece], b.offset, b.length, &wanted);
    }
  }
  std::map<std::string, size_t> order;  // tensor name -> index in `tensors`
  for (size_t i = 0; i < tensors.size(); ++i) order.emplace(tensors[i].name, i);
  std::vector<std::vector<Segment>> by_tensor(tensors.size());
  for (Segment& s : wanted) {
    auto it = order.find(s.tensor);
    if (it == order.end()) {
      return InvalidArgumentError(fmt::format(
          "rank {}: the plan names bytes [{}, +{}) of tensor '{}', which the rank does not "
          "register",
          rank, s.offset, s.length, s.tensor));
    }
    const uint64_t size = tensors[it->second].nbytes();
    if (s.offset > size || s.length > size - s.offset) {
      return InvalidArgumentError(
          fmt::format("rank {}: the plan names bytes [{}, +{}) of tensor '{}', which has {} bytes",
                      rank, s.offset, s.length, s.tensor, size));
    }
    by_tensor[it->second].push_back(std::move(s));
  }
  std::vector<Segment> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::vector<Segment>& list = by_tensor[i];
    if (tensors[i].nbytes() == 0) {
      out.push_back(Segment{tensors[i].name, 0, 0});
      continue;
    }
    std::sort(list.begin(), list.end(),
              [](const Segment& a, const Segment& b) { return a.offset < b.offset; });
    for (const Segment& s : list) {
      if (s.length == 0) continue;
      if (!out.empty() && out.back().tensor == s.tensor &&
          out.back().offset + out.back().length >= s.offset) {
        const uint64_t end = std::max(out.back().offset + out.back().length, s.offset + s.length);
        out.back().length = end - out.back().offset;
      } else {
        out.push_back(s);
      }
    }
  }
  return out;
}

bool CoversEveryTensor(const std::vector<Segment>& ranges, const std::vector<TensorMeta>& tensors) {
  std::map<std::string, uint64_t> whole;
  for (const Segment& s : ranges) {
    if (s.offset == 0) whole[s.tensor] = s.length;
  }
  for (const TensorMeta& t : tensors) {
    auto it = whole.find(t.name);
    if (it == whole.end() || it->second != t.nbytes()) return false;
  }
  return true;
}

}  // namespace memento::topo
