#include "agent/resident.h"

#include <cstring>

#include "codec/erasure_code.h"
#include "topo/save_ranges.h"

namespace memento::agent {

namespace {

// True when parity `index` of a stripe of one data block equals that block
// (its code row is 1): XOR, and the first Cauchy row of RS.
bool ParityIsItsBlock(const topo::Stripe& stripe, int index) {
  if (stripe.k != 1) return false;
  auto code = codec::ErasureCode::Create(
      stripe.xor_code ? codec::CodeKind::kXor : codec::CodeKind::kRs, stripe.k, stripe.f);
  if (!code.ok()) return false;
  constexpr size_t kLen = 64;
  uint8_t in[kLen];
  for (size_t i = 0; i < kLen; ++i) in[i] = static_cast<uint8_t>(i * 7 + 1);
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(stripe.f), std::vector<uint8_t>(kLen));
  std::vector<uint8_t*> outp;
  for (auto& o : out) outp.push_back(o.data());
  const uint8_t* data[1] = {in};
  code->Encode(kLen, data, outp.data());
  return std::memcmp(out[static_cast<size_t>(index)].data(), in, kLen) == 0;
}

}  // namespace

std::optional<ResidentSource> T0ResidentSource(const topo::Plan& plan, recover::ByteSource entry) {
  if (entry.kind == recover::SourceKind::kParity) {
    if (entry.id >= plan.parities.size()) return std::nullopt;
    const topo::Parity& par = plan.parities[entry.id];
    if (par.producer_rank < 0 || par.id != entry.id) return std::nullopt;
    ResidentSource src;
    src.rank = par.producer_rank;
    src.parity = par.id;
    src.bytes = par.bytes;
    if (par.stripe < plan.stripes.size()) {
      const topo::Stripe& stripe = plan.stripes[par.stripe];
      if (stripe.k == 1 && stripe.data.size() == 1 && stripe.data[0].length > 0 &&
          stripe.data[0].length <= par.bytes && ParityIsItsBlock(stripe, par.index)) {
        src.segments = topo::StripeBlockSegments(plan, stripe)[0];
      }
    }
    return src;
  }
  if (entry.kind != recover::SourceKind::kCopy || entry.id >= plan.copies.size()) {
    return std::nullopt;
  }
  const topo::Copy& c = plan.copies[entry.id];
  if (c.kind != topo::CopyKind::kArc && c.kind != topo::CopyKind::kLocalFull) return std::nullopt;
  if (c.producer_rank < 0 || c.piece >= plan.pieces.size()) return std::nullopt;
  ResidentSource src;
  src.rank = c.producer_rank;
  src.segments = plan.pieces[c.piece].segments;
  src.bytes = plan.pieces[c.piece].bytes;
  return src;
}

}  // namespace memento::agent
