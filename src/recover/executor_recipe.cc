// Recipes in the executor: the checks of a recipe against the plan, the
// recipe of a restore-time assembly (PrimaryRecipe), the tiling check of a
// rank's pieces (CheckPiecesTile) and the executor's first step,
// ParseAssemblies (executor_steps.h). docs/recovery.md, "Recipe".
#include <algorithm>
#include <map>
#include <set>

#include "fmt/format.h"
#include "recover/executor_steps.h"
#include "recover/recipe.h"

namespace memento::recover {
namespace internal {

std::string Describe(const SourceRange& r, int64_t step) {
  return fmt::format("{} {} bytes [{}, {}) on node {} at step {}", SourceKindName(r.source.kind),
                     r.source.id, r.offset, r.offset + r.length, r.node, step);
}

}  // namespace internal

using internal::Describe;
using internal::Extent;

namespace {

// The pieces whose bytes make up `rank`'s whole state (the recipe's parts).
std::vector<uint32_t> RankPieces(const topo::Plan& plan, int rank) {
  std::vector<uint32_t> out;
  const int g = plan.ranks[rank].group;
  for (const topo::Piece& p : plan.pieces) {
    if ((p.kind == topo::PieceKind::kReplicatedShard && p.group == g) ||
        (p.kind != topo::PieceKind::kReplicatedShard && p.rank == rank)) {
      out.push_back(p.id);
    }
  }
  return out;
}

// Checks a recipe against the plan: every non-empty piece of the rank exactly
// once, every range inside its source, decode blocks that tile their piece.
Status CheckRecipe(const topo::Plan& plan, const Recipe& r) {
  auto bad = [&](const std::string& what) {
    return InvalidArgumentError(
        fmt::format("recipe of rank {} (step {}): {}", r.rank, r.step, what));
  };
  std::set<uint32_t> want;
  for (uint32_t id : RankPieces(plan, r.rank)) {
    if (plan.pieces[id].bytes != 0) want.insert(id);
  }
  std::set<uint32_t> have;
  const int num_nodes = static_cast<int>(plan.nodes.size());
  auto check_range = [&](const SourceRange& s, uint64_t limit) -> Status {
    if (s.node < 0 || s.node >= num_nodes) return bad(fmt::format("source node {}", s.node));
    uint64_t size = 0;
    switch (s.source.kind) {
      case SourceKind::kPiece:
        if (s.source.id >= plan.pieces.size()) return bad("piece id out of range");
        size = plan.pieces[s.source.id].bytes;
        break;
      case SourceKind::kCopy:
        if (s.source.id >= plan.copies.size()) return bad("copy id out of range");
        size = plan.pieces[plan.copies[s.source.id].piece].bytes;
        break;
      case SourceKind::kParity:
        if (s.source.id >= plan.parities.size()) return bad("parity id out of range");
        size = plan.parities[s.source.id].bytes;
        break;
    }
    if (s.offset > size || s.length > size - s.offset || s.length > limit) {
      return bad("range out of bounds: " + Describe(s, r.step));
    }
    return Status::Ok();
  };
  for (const PiecePart& part : r.parts) {
    if (part.piece >= plan.pieces.size() || !want.count(part.piece) ||
        !have.insert(part.piece).second) {
      return bad(fmt::format("piece {} is not one of the rank's, or repeated", part.piece));
    }
    const topo::Piece& p = plan.pieces[part.piece];
    if (part.bytes != p.bytes)
      return bad(fmt::format("{} has {} bytes, not {}", p.key, p.bytes, part.bytes));
    if (part.op == PiecePart::Op::kRead) {
      MEMENTO_RETURN_IF_ERROR(check_range(part.read, p.bytes));
      if (part.read.offset != 0 || part.read.length != p.bytes ||
          part.read.source.kind == SourceKind::kParity ||
          (part.read.source.kind == SourceKind::kPiece && part.read.source.id != part.piece) ||
          (part.read.source.kind == SourceKind::kCopy &&
           plan.copies[part.read.source.id].piece != part.piece)) {
        return bad("read of " + p.key + " does not name the whole piece or a copy of it");
      }
      continue;
    }
    uint64_t covered = 0;
    std::set<std::pair<uint32_t, int>> seen;
    for (const DecodeBlock& b : part.blocks) {
      if (b.stripe >= plan.stripes.size()) return bad("stripe id out of range");
      const topo::Stripe& s = plan.stripes[b.stripe];
      if (b.target < 0 || b.target >= s.k || s.data[b.target].piece != part.piece ||
          s.data[b.target].offset != b.offset || s.data[b.target].length != b.length ||
          !seen.insert({b.stripe, b.target}).second) {
        return bad(fmt::format("decode block (stripe {}, target {}) is not a block of {}", b.stripe,
                               b.target, p.key));
      }
      if (static_cast<int>(b.inputs.size()) != s.k) {
        return bad(fmt::format("stripe {} decode has {} inputs, needs k={}", b.stripe,
                               b.inputs.size(), s.k));
      }
      std::set<int> idx;
      for (const DecodeInput& in : b.inputs) {
        if (in.index < 0 || in.index >= s.k + s.f || in.index == b.target ||
            !idx.insert(in.index).second) {
          return bad(fmt::format("stripe {} decode input index {}", b.stripe, in.index));
        }
        if (in.zero) {
          if (in.index >= s.k || s.data[in.index].length != 0) {
            return bad(fmt::format("stripe {} block {} is not empty", b.stripe, in.index));
          }
          continue;
        }
        MEMENTO_RETURN_IF_ERROR(check_range(in.range, s.block_bytes));
      }
      covered += b.length;
    }
    if (covered != p.bytes) {
      return bad(
          fmt::format("decode blocks cover {} of the {} bytes of {}", covered, p.bytes, p.key));
    }
  }
  if (have.size() != want.size()) {
    return bad(fmt::format("names {} of the rank's {} non-empty pieces", have.size(), want.size()));
  }
  return Status::Ok();
}

// Where each piece of `recipe` lies in the rank's slot (`layout`): its
// segments, in piece order, as extents of the slot's data region.
Result<std::map<uint32_t, std::vector<Extent>>> PieceExtents(const topo::Plan& plan,
                                                             const Recipe& recipe,
                                                             const shm::SlotLayout& layout) {
  std::map<std::string, const shm::SavedTensor*> by_name;
  for (const shm::SavedTensor& t : layout.tensors) by_name[t.meta.name] = &t;
  std::map<uint32_t, std::vector<Extent>> extents;
  for (const PiecePart& part : recipe.parts) {
    std::vector<Extent>& ext = extents[part.piece];
    uint64_t at = 0;
    for (const topo::Segment& seg : plan.pieces[part.piece].segments) {
      auto it = by_name.find(seg.tensor);
      if (it == by_name.end() || seg.offset + seg.length > it->second->nbytes) {
        return InvalidArgumentError(
            fmt::format("rank {}: piece {} names bytes [{}, {}) of tensor '{}', which the rank's "
                        "inventory does not register with that size",
                        recipe.rank, plan.pieces[part.piece].key, seg.offset,
                        seg.offset + seg.length, seg.tensor));
      }
      ext.push_back(Extent{at, it->second->offset + seg.offset, seg.length});
      at += seg.length;
    }
  }
  return extents;
}

}  // namespace

Result<Recipe> PrimaryRecipe(const topo::Plan& plan, int rank, int64_t step) {
  if (rank < 0 || rank >= static_cast<int>(plan.ranks.size())) {
    return InvalidArgumentError(
        fmt::format("rank {} is not in the plan ({} ranks)", rank, plan.ranks.size()));
  }
  Recipe r;
  r.step = step;
  r.rank = rank;
  r.node = plan.ranks[rank].node;
  for (uint32_t id : RankPieces(plan, rank)) {
    const topo::Piece& p = plan.pieces[id];
    if (p.bytes == 0) continue;
    PiecePart part;
    part.piece = id;
    part.key = p.key;
    part.bytes = p.bytes;
    part.op = PiecePart::Op::kRead;
    part.read = SourceRange{p.node, ByteSource{SourceKind::kPiece, id}, 0, p.bytes};
    r.parts.push_back(std::move(part));
  }
  return r;
}

Status CheckPiecesTile(const topo::Plan& plan, int rank, const std::vector<TensorMeta>& tensors) {
  struct Cover {
    uint64_t offset, length;
    uint32_t piece;
  };
  std::map<std::string, std::vector<Cover>> by_tensor;
  for (const TensorMeta& t : tensors) by_tensor[t.name];
  auto where = [&](uint32_t id) {
    const topo::Piece& p = plan.pieces[id];
    return fmt::format("piece {} (rank {}, node {})", p.key, p.rank, p.node);
  };
  for (uint32_t id : RankPieces(plan, rank)) {
    for (const topo::Segment& s : plan.pieces[id].segments) {
      if (s.length == 0) continue;
      auto it = by_tensor.find(s.tensor);
      if (it == by_tensor.end()) {
        return FailedPreconditionError(
            fmt::format("rank {}: {} holds bytes [{}, {}) of tensor '{}', which the rank does not "
                        "register",
                        rank, where(id), s.offset, s.offset + s.length, s.tensor));
      }
      it->second.push_back(Cover{s.offset, s.length, id});
    }
  }
  for (const TensorMeta& t : tensors) {
    std::vector<Cover>& c = by_tensor[t.name];
    std::sort(c.begin(), c.end(),
              [](const Cover& a, const Cover& b) { return a.offset < b.offset; });
    uint64_t at = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      if (c[i].offset > at) {
        return FailedPreconditionError(fmt::format(
            "rank {}: bytes [{}, {}) of tensor '{}' are in no piece of the plan (the next, {}, "
            "starts there)",
            rank, at, c[i].offset, t.name, where(c[i].piece)));
      }
      if (c[i].offset < at) {
        return FailedPreconditionError(
            fmt::format("rank {}: bytes [{}, {}) of tensor '{}' are in two pieces: {} and {}", rank,
                        c[i].offset, std::min(at, c[i].offset + c[i].length), t.name,
                        where(c[i - 1].piece), where(c[i].piece)));
      }
      at = c[i].offset + c[i].length;
    }
    if (at != t.nbytes()) {
      return FailedPreconditionError(
          fmt::format("rank {}: bytes [{}, {}) of tensor '{}' ({} bytes) are {}", rank,
                      std::min(at, t.nbytes()), std::max(at, t.nbytes()), t.name, t.nbytes(),
                      at < t.nbytes() ? "in no piece of the plan" : "past its end in a piece"));
    }
  }
  return Status::Ok();
}

namespace internal {

Result<std::vector<RankJob>> ParseAssemblies(const topo::Plan& plan,
                                             const topo::Inventory& inventory,
                                             const std::string& job_id, int64_t step, int node,
                                             const std::vector<RankAssembly>& assemblies,
                                             const ExecuteOptions& options) {
  std::vector<RankJob> jobs;
  std::set<int> ranks_seen;
  for (const RankAssembly& a : assemblies) {
    MEMENTO_ASSIGN_OR_RETURN(Recipe recipe, RecipeFromJson(a.recipe));
    if (a.rank < 0 || a.rank >= static_cast<int>(plan.ranks.size()) || recipe.rank != a.rank ||
        recipe.step != step || recipe.node != a.node || a.node != node ||
        plan.topology.rank_node[a.rank] != node) {
      return InvalidArgumentError(fmt::format(
          "assembly of rank {} (recipe rank {}, step {}, node {}) does not belong to step {} on "
          "node {}",
          a.rank, recipe.rank, recipe.step, a.node, step, node));
    }
    if (!ranks_seen.insert(a.rank).second) {
      return InvalidArgumentError(fmt::format("rank {} is assembled twice", a.rank));
    }
    MEMENTO_RETURN_IF_ERROR(CheckRecipe(plan, recipe));
    RankJob job;
    job.recipe = std::move(recipe);
    MEMENTO_ASSIGN_OR_RETURN(
        job.layout, shm::ComputeSlotLayout(job_id, a.rank, inventory[a.rank], options.chunk_bytes));
    MEMENTO_ASSIGN_OR_RETURN(job.extents, PieceExtents(plan, job.recipe, job.layout));
    if (options.stage_path) {
      MEMENTO_RETURN_IF_ERROR(CheckPiecesTile(plan, a.rank, inventory[a.rank]));
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

}  // namespace internal
}  // namespace memento::recover
