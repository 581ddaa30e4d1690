#include "agent/resident.h"

namespace memento::agent {

std::optional<ResidentSource> T0ResidentSource(const topo::Plan& plan, recover::ByteSource entry) {
  if (entry.kind == recover::SourceKind::kParity) {
    if (entry.id >= plan.parities.size()) return std::nullopt;
    const topo::Parity& par = plan.parities[entry.id];
    if (par.producer_rank < 0 || par.id != entry.id) return std::nullopt;
    ResidentSource src;
    src.rank = par.producer_rank;
    src.parity = par.id;
    src.bytes = par.bytes;
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
