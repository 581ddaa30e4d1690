#include "tier/format.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/json_parse.h"

namespace memento::tier {

using nlohmann::json;

std::string VersionDirName(int64_t step) { return fmt::format("version-{:020d}", step); }

std::optional<int64_t> ParseVersionDirName(const std::string& name) {
  static constexpr char kPrefix[] = "version-";
  constexpr size_t kLen = sizeof(kPrefix) - 1;
  if (name.size() != kLen + 20 || name.compare(0, kLen, kPrefix) != 0) return std::nullopt;
  int64_t v = 0;
  for (size_t i = kLen; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::string NodeDataFileName(int node) { return fmt::format("node-{:05d}.safetensors", node); }
std::string NodeManifestName(int node) { return fmt::format("node-{:05d}.json", node); }
std::string NodeMarkerName(int node) { return fmt::format("node-{:05d}.done", node); }

std::string HexU64(uint64_t v) { return fmt::format("{:016x}", v); }

Result<uint64_t> ParseHexU64(const std::string& s) {
  if (s.size() != 16) return DataLossError("checksum '" + s + "' is not 16 hex digits");
  char* end = nullptr;
  uint64_t v = std::strtoull(s.c_str(), &end, 16);
  if (end != s.c_str() + s.size()) return DataLossError("checksum '" + s + "' is not hex");
  return v;
}

TpSlice TpSlice::Even(std::vector<int64_t> global_shape, int dim, int tp_rank, int tp_size) {
  TpSlice s;
  s.dim = dim;
  s.global_shape = std::move(global_shape);
  if (dim >= 0 && dim < static_cast<int>(s.global_shape.size()) && tp_size > 0) {
    const int64_t part = s.global_shape[dim] / tp_size;
    s.begin = part * tp_rank;
    s.end = tp_rank == tp_size - 1 ? s.global_shape[dim] : s.begin + part;
  }
  return s;
}

std::vector<int64_t> TpSlice::LocalShape() const {
  std::vector<int64_t> shape = global_shape;
  if (dim >= 0 && dim < static_cast<int>(shape.size())) shape[dim] = end - begin;
  return shape;
}

Status CheckTpSlice(const TpSlice& s, const std::vector<int64_t>& local_shape,
                    const std::string& name) {
  if (!s.split()) return Status::Ok();
  if (s.dim >= static_cast<int>(s.global_shape.size())) {
    return InvalidArgumentError(fmt::format("tensor '{}': TP split dimension {} of a {}-d tensor",
                                            name, s.dim, s.global_shape.size()));
  }
  if (s.begin < 0 || s.begin >= s.end || s.end > s.global_shape[s.dim]) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': TP slice [{}, {}) of dimension {} outside its {} rows", name,
                    s.begin, s.end, s.dim, s.global_shape[s.dim]));
  }
  if (s.LocalShape() != local_shape) {
    return InvalidArgumentError(fmt::format(
        "tensor '{}': shape {} is not slice [{}, {}) of dimension {} of global shape {} ({})", name,
        ShapeToString(local_shape), s.begin, s.end, s.dim, ShapeToString(s.global_shape),
        ShapeToString(s.LocalShape())));
  }
  return Status::Ok();
}

uint64_t VersionIndex::stored_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors) {
    for (const auto& p : t.pieces) n += p.length;
  }
  return n;
}

std::string SerializeIndex(const VersionIndex& index) {
  json j;
  j["format"] = "memento-durable";
  j["format_version"] = index.format_version;
  j["job"] = index.job;
  j["step"] = index.step;
  j["num_nodes"] = index.num_nodes;
  json topo = json::parse(index.topology_json, nullptr, /*allow_exceptions=*/false);
  j["topology"] = topo.is_discarded() ? json(index.topology_json) : topo;
  j["created_unix_ns"] = index.created_unix_ns;
  j["nodes"] = json::array();
  for (const auto& n : index.nodes) {
    j["nodes"].push_back(
        {{"node", n.node}, {"file", n.file}, {"file_size", n.file_size}, {"manifest", n.manifest}});
  }
  json tensors = json::object();
  for (const auto& [name, t] : index.tensors) {
    json jt;
    jt["dtype"] = std::string(DTypeName(t.dtype));
    jt["shape"] = t.shape;
    jt["state_class"] = std::string(StateClassName(t.state_class));
    jt["global"] = t.global;
    if (t.split_dim >= 0) jt["split_dim"] = t.split_dim;
    if (!t.ranks.empty()) jt["ranks"] = t.ranks;
    jt["nbytes"] = t.nbytes;
    jt["pieces"] = json::array();
    for (const auto& p : t.pieces) {
      json jp = {{"key", p.key},
                 {"node", p.node},
                 {"file", p.file},
                 {"file_offset", p.file_offset},
                 {"tensor_offset", p.tensor_offset},
                 {"length", p.length},
                 {"xxh3", HexU64(p.xxh3)}};
      if (t.split_dim >= 0) jp["slice"] = {p.slice_begin, p.slice_end};
      jt["pieces"].push_back(std::move(jp));
    }
    tensors[name] = std::move(jt);
  }
  j["tensors"] = std::move(tensors);
  return j.dump(1);
}

namespace {

Status CheckFormatVersion(const json& j, const std::string& what) {
  int v = j.at("format_version").get<int>();
  if (v < 1 || v > kMaxFormatVersion) {
    return FailedPreconditionError(
        fmt::format("{}: format_version {} is not supported (this build reads 1..{})", what, v,
                    kMaxFormatVersion));
  }
  return Status::Ok();
}

}  // namespace

Result<VersionIndex> ParseIndex(const std::string& text, const std::string& what) {
  try {
    json j = ParseForeignJson(text);
    MEMENTO_RETURN_IF_ERROR(CheckFormatVersion(j, what));
    VersionIndex index;
    index.format_version = j.at("format_version").get<int>();
    index.job = j.at("job").get<std::string>();
    index.step = j.at("step").get<int64_t>();
    index.num_nodes = j.at("num_nodes").get<int>();
    const json& topo = j.at("topology");
    index.topology_json = topo.is_string() ? topo.get<std::string>() : topo.dump();
    index.created_unix_ns = j.value("created_unix_ns", int64_t{0});
    for (const auto& jn : j.at("nodes")) {
      NodeRecord n;
      n.node = jn.at("node").get<int>();
      n.file = jn.at("file").get<std::string>();
      n.file_size = jn.at("file_size").get<uint64_t>();
      n.manifest = jn.at("manifest").get<std::string>();
      index.nodes.push_back(std::move(n));
    }
    for (const auto& [name, jt] : j.at("tensors").items()) {
      TensorRecord t;
      t.name = name;
      MEMENTO_ASSIGN_OR_RETURN(t.dtype, ParseDType(jt.at("dtype").get<std::string>()));
      t.shape = jt.at("shape").get<std::vector<int64_t>>();
      MEMENTO_ASSIGN_OR_RETURN(t.state_class,
                               ParseStateClass(jt.at("state_class").get<std::string>()));
      t.global = jt.value("global", false);
      t.split_dim = jt.value("split_dim", -1);
      if (jt.contains("ranks")) t.ranks = jt.at("ranks").get<std::vector<int>>();
      t.nbytes = jt.at("nbytes").get<uint64_t>();
      if (t.split_dim >= static_cast<int>(t.shape.size()) || (t.split_dim >= 0 && t.global)) {
        return DataLossError(fmt::format("{}: tensor '{}' has split_dim {} (shape {}{})", what,
                                         name, t.split_dim, ShapeToString(t.shape),
                                         t.global ? ", DP-global" : ""));
      }
      for (const auto& jp : jt.at("pieces")) {
        PieceRecord p;
        p.key = jp.at("key").get<std::string>();
        p.node = jp.at("node").get<int>();
        p.file = jp.at("file").get<std::string>();
        p.file_offset = jp.at("file_offset").get<uint64_t>();
        p.tensor_offset = jp.at("tensor_offset").get<uint64_t>();
        p.length = jp.at("length").get<uint64_t>();
        MEMENTO_ASSIGN_OR_RETURN(p.xxh3, ParseHexU64(jp.at("xxh3").get<std::string>()));
        uint64_t limit = t.nbytes;  // the bytes the piece's offsets are relative to
        if (t.split_dim >= 0) {
          auto slice = jp.at("slice").get<std::vector<int64_t>>();
          const int64_t rows = t.shape[t.split_dim];
          if (slice.size() != 2 || slice[0] < 0 || slice[0] >= slice[1] || slice[1] > rows) {
            return DataLossError(
                fmt::format("{}: piece {} of tensor '{}' has a bad slice", what, p.key, name));
          }
          p.slice_begin = slice[0];
          p.slice_end = slice[1];
          limit = rows == 0 ? 0 : t.nbytes / rows * (p.slice_end - p.slice_begin);
        }
        if (p.tensor_offset + p.length > limit || p.tensor_offset + p.length < p.length) {
          return DataLossError(
              fmt::format("{}: piece {} of tensor '{}' ends at {} past its {} bytes", what, p.key,
                          name, p.tensor_offset + p.length, limit));
        }
        t.pieces.push_back(std::move(p));
      }
      index.tensors.emplace(name, std::move(t));
    }
    return index;
  } catch (const json::exception& e) {
    return DataLossError(what + ": malformed index: " + e.what());
  }
}

Status MergeIndex(const VersionIndex& part, VersionIndex* into) {
  into->format_version = std::max(into->format_version, part.format_version);
  for (const auto& n : part.nodes) into->nodes.push_back(n);
  for (const auto& [name, t] : part.tensors) {
    auto it = into->tensors.find(name);
    if (it == into->tensors.end()) {
      into->tensors.emplace(name, t);
      continue;
    }
    TensorRecord& have = it->second;
    if (have.dtype != t.dtype || have.shape != t.shape || have.nbytes != t.nbytes ||
        have.state_class != t.state_class || have.global != t.global ||
        have.split_dim != t.split_dim) {
      return InvalidArgumentError(fmt::format(
          "tensor '{}' is described differently by two nodes: {} {} {} vs {} {} {}", name,
          DTypeName(have.dtype), ShapeToString(have.shape), StateClassName(have.state_class),
          DTypeName(t.dtype), ShapeToString(t.shape), StateClassName(t.state_class)));
    }
    for (const auto& p : t.pieces) have.pieces.push_back(p);
    for (int r : t.ranks) {
      if (std::find(have.ranks.begin(), have.ranks.end(), r) == have.ranks.end()) {
        have.ranks.push_back(r);
      }
    }
    std::sort(have.ranks.begin(), have.ranks.end());
  }
  return Status::Ok();
}

std::string RankScopedName(int rank, const std::string& name) {
  return fmt::format("rank{}/{}", rank, name);
}

Result<std::string> RankTensorName(const VersionIndex& index, int rank, const std::string& name) {
  auto lists = [rank](const TensorRecord& t) {
    return std::find(t.ranks.begin(), t.ranks.end(), rank) != t.ranks.end();
  };
  const std::string own = RankScopedName(rank, name);
  auto it = index.tensors.find(own);
  if (it != index.tensors.end() && (it->second.ranks.empty() || lists(it->second))) return own;
  const std::string suffix = "/" + name;
  for (const auto& [stored, t] : index.tensors) {
    if (stored.rfind("rank", 0) == 0 && stored.size() > suffix.size() &&
        stored.compare(stored.size() - suffix.size(), suffix.size(), suffix) == 0 && lists(t) &&
        stored.find('/') == stored.size() - suffix.size()) {
      return stored;
    }
  }
  it = index.tensors.find(name);
  if (it == index.tensors.end()) {
    return NotFoundError(
        fmt::format("rank {}'s tensor '{}' is not in version {} (neither '{}' nor '{}')", rank,
                    name, index.step, own, name));
  }
  const TensorRecord& t = it->second;
  if (!t.ranks.empty()) {
    if (lists(t)) return name;
    return NotFoundError(
        fmt::format("rank {}'s tensor '{}' is not in version {}: '{}' holds ranks {} only", rank,
                    name, index.step, name, fmt::join(t.ranks, ",")));
  }
  // No `ranks`: a cluster version (its names are global), or a node-local
  // version written before the field existed.
  json topo = json::parse(index.topology_json, nullptr, /*allow_exceptions=*/false);
  if (t.state_class == StateClass::kReplicated && !topo.is_discarded() && topo.is_object() &&
      topo.value("source", "") == "memento agent" && topo.contains("ranks") &&
      topo["ranks"].is_array() && topo["ranks"].size() > 1) {
    std::vector<int> node_ranks;
    for (const auto& r : topo["ranks"]) {
      if (r.is_number_integer()) node_ranks.push_back(r.get<int>());
    }
    if (!node_ranks.empty() && rank != *std::min_element(node_ranks.begin(), node_ranks.end())) {
      return FailedPreconditionError(fmt::format(
          "version {} cannot be trusted for rank {}'s tensor '{}': it was written by an older "
          "memento that stored a replicated tensor once per node, from the node's lowest rank of "
          "{}, without checking that the node's other ranks (other pipeline stages or TP "
          "positions) held the same bytes; restore a version written by this memento, or that "
          "rank's state from memory",
          index.step, rank, name, fmt::join(node_ranks, ",")));
    }
  }
  return name;
}

std::string SerializeNodeMarker(const NodeMarker& m) {
  json j{{"format_version", kFormatVersion},
         {"node", m.node},
         {"step", m.step},
         {"epoch", m.epoch},
         {"file", m.file},
         {"file_size", m.file_size},
         {"manifest", m.manifest},
         {"manifest_size", m.manifest_size},
         {"manifest_xxh3", HexU64(m.manifest_xxh3)}};
  return j.dump(1);
}

Result<NodeMarker> ParseNodeMarker(const std::string& text, const std::string& what) {
  try {
    json j = ParseForeignJson(text);
    MEMENTO_RETURN_IF_ERROR(CheckFormatVersion(j, what));
    NodeMarker m;
    m.node = j.at("node").get<int>();
    m.step = j.at("step").get<int64_t>();
    m.epoch = j.value("epoch", uint64_t{0});
    m.file = j.at("file").get<std::string>();
    m.file_size = j.at("file_size").get<uint64_t>();
    m.manifest = j.at("manifest").get<std::string>();
    m.manifest_size = j.at("manifest_size").get<uint64_t>();
    MEMENTO_ASSIGN_OR_RETURN(m.manifest_xxh3,
                             ParseHexU64(j.at("manifest_xxh3").get<std::string>()));
    return m;
  } catch (const json::exception& e) {
    return DataLossError(what + ": malformed node marker: " + e.what());
  }
}

std::string SerializeCommit(const CommitRecord& c) {
  json j{{"format", "memento-durable"},
         {"format_version", c.format_version},
         {"step", c.step},
         {"index", c.index},
         {"index_size", c.index_size},
         {"index_xxh3", HexU64(c.index_xxh3)},
         {"files", c.files}};
  return j.dump(1);
}

Result<CommitRecord> ParseCommit(const std::string& text, const std::string& what) {
  try {
    json j = ParseForeignJson(text);
    MEMENTO_RETURN_IF_ERROR(CheckFormatVersion(j, what));
    CommitRecord c;
    c.format_version = j.at("format_version").get<int>();
    c.step = j.at("step").get<int64_t>();
    c.index = j.at("index").get<std::string>();
    c.index_size = j.at("index_size").get<uint64_t>();
    MEMENTO_ASSIGN_OR_RETURN(c.index_xxh3, ParseHexU64(j.at("index_xxh3").get<std::string>()));
    c.files = j.at("files").get<std::vector<std::string>>();
    return c;
  } catch (const json::exception& e) {
    return DataLossError(what + ": malformed commit marker: " + e.what());
  }
}

}  // namespace memento::tier
