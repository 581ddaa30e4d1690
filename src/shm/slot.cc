#include "shm/slot.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/json_parse.h"
#include "common/tensor_json.h"
#include "fmt/format.h"

namespace memento::shm {

const char* SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kEmpty:
      return "empty";
    case SlotState::kWriting:
      return "writing";
    case SlotState::kComplete:
      return "complete";
  }
  return "unknown";
}

namespace {

bool ValidJobId(const std::string& job) {
  if (job.empty() || job.size() >= kJobIdBytes) return false;
  for (char c : job) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return false;
    }
  }
  return job != "." && job != "..";
}

SlotHeader* Header(const Segment& segment) { return reinterpret_cast<SlotHeader*>(segment.data()); }

uint64_t HeaderChecksum(const SlotHeader* h) {
  return Checksum(h, offsetof(SlotHeader, header_checksum));
}

}  // namespace

std::string EntryName(const SavedTensor& t) {
  if (t.is_parity()) return fmt::format("parity {}", t.parity);
  if (t.whole()) return "'" + t.meta.name + "'";
  return fmt::format("'{}' bytes [{}, {})", t.meta.name, t.range_offset, t.range_offset + t.nbytes);
}

bool HasRangeEntries(const std::vector<SavedTensor>& entries) {
  for (const SavedTensor& t : entries) {
    if (t.ranged || !t.whole() || t.is_parity()) return true;
  }
  return false;
}

std::string ParityEntryName(uint32_t parity) { return fmt::format("parity/{}", parity); }

TensorMeta ParityEntryMeta(uint32_t parity, uint64_t bytes) {
  TensorMeta m;
  m.name = ParityEntryName(parity);
  m.dtype = DType::kUInt8;
  m.shape = {static_cast<int64_t>(bytes)};
  m.state_class = StateClass::kPrivate;
  return m;
}

int FindParityEntry(const std::vector<SavedTensor>& entries, uint32_t parity) {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].parity == parity) return static_cast<int>(i);
  }
  return -1;
}

namespace {

// Entries of one tensor must agree on its meta and hold disjoint ranges.
Status CheckEntriesOfOneTensor(const std::vector<SavedTensor>& entries) {
  std::map<std::string, std::vector<const SavedTensor*>> by_name;
  std::map<uint32_t, int> parities;
  for (const SavedTensor& t : entries) {
    if (!t.is_parity()) {
      by_name[t.meta.name].push_back(&t);
      continue;
    }
    if (!t.whole() || t.meta.dtype != DType::kUInt8 || t.meta.shape.size() != 1) {
      return InvalidArgumentError(fmt::format(
          "parity {}: a parity entry is a whole uint8 vector, not {} {} bytes [{}, +{})", t.parity,
          DTypeName(t.meta.dtype), ShapeToString(t.meta.shape), t.range_offset, t.nbytes));
    }
    if (++parities[t.parity] > 1) {
      return InvalidArgumentError(fmt::format("parity {} has two entries", t.parity));
    }
  }
  for (auto& [name, list] : by_name) {
    if (list.size() < 2) continue;
    for (const SavedTensor* t : list) {
      const TensorMeta& a = list[0]->meta;
      if (t->meta.dtype != a.dtype || t->meta.shape != a.shape ||
          t->meta.state_class != a.state_class) {
        return InvalidArgumentError(fmt::format(
            "entries of tensor '{}' disagree: {} {} and {} {}", name, DTypeName(a.dtype),
            ShapeToString(a.shape), DTypeName(t->meta.dtype), ShapeToString(t->meta.shape)));
      }
    }
    std::sort(list.begin(), list.end(), [](const SavedTensor* x, const SavedTensor* y) {
      return x->range_offset < y->range_offset;
    });
    for (size_t i = 1; i < list.size(); ++i) {
      if (list[i - 1]->range_offset + list[i - 1]->nbytes > list[i]->range_offset) {
        if (list[i - 1]->whole() || list[i]->whole()) {
          return InvalidArgumentError("tensor name '" + name + "' registered twice");
        }
        return InvalidArgumentError(
            fmt::format("entries {} and {} overlap", EntryName(*list[i - 1]), EntryName(*list[i])));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Result<SlotLayout> ComputeSlotLayout(const std::string& job_id, int rank,
                                     const std::vector<TensorMeta>& tensors, uint64_t chunk_bytes) {
  std::vector<SlotEntrySpec> entries;
  entries.reserve(tensors.size());
  for (const TensorMeta& m : tensors) entries.push_back(SlotEntrySpec{m, 0, kWholeTensor});
  return ComputeRangeSlotLayout(job_id, rank, entries, chunk_bytes);
}

Result<SlotLayout> ComputeRangeSlotLayout(const std::string& job_id, int rank,
                                          const std::vector<SlotEntrySpec>& entries,
                                          uint64_t chunk_bytes) {
  if (!ValidJobId(job_id)) {
    return InvalidArgumentError("job id '" + job_id +
                                "' must be 1-63 letters, digits, '-', '_' or '.'");
  }
  if (chunk_bytes == 0) return InvalidArgumentError("chunk size must be > 0");
  SlotLayout layout;
  layout.job_id = job_id;
  layout.rank = rank;
  layout.chunk_bytes = chunk_bytes;
  uint64_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const TensorMeta& meta = entries[i].meta;
    if (meta.name.empty()) return InvalidArgumentError(fmt::format("tensor {} has no name", i));
    for (int64_t d : meta.shape) {
      if (d < 0) {
        return InvalidArgumentError("tensor '" + meta.name + "' has a negative dimension in " +
                                    ShapeToString(meta.shape));
      }
    }
    SavedTensor t;
    t.meta = meta;
    t.parity = entries[i].parity;
    t.offset = AlignUp(offset, kTensorAlignment);
    const uint64_t whole = meta.nbytes();
    if (entries[i].length == kWholeTensor) {
      if (entries[i].offset != 0) {
        return InvalidArgumentError(
            fmt::format("tensor '{}': a whole entry at offset {}", meta.name, entries[i].offset));
      }
      t.nbytes = whole;
    } else {
      if (entries[i].length == 0 || entries[i].offset > whole ||
          entries[i].length > whole - entries[i].offset) {
        return InvalidArgumentError(
            fmt::format("tensor '{}' ({} bytes): range [{}, +{}) is empty or outside it", meta.name,
                        whole, entries[i].offset, entries[i].length));
      }
      t.range_offset = entries[i].offset;
      t.nbytes = entries[i].length;
      t.ranged = true;
    }
    for (uint64_t c = 0; c < t.nbytes; c += chunk_bytes) {
      ChunkEntry e{};
      e.offset = t.offset + c;
      e.length = std::min<uint64_t>(chunk_bytes, t.nbytes - c);
      e.tensor_index = static_cast<uint32_t>(i);
      layout.chunks.push_back(e);
    }
    offset = t.offset + t.nbytes;
    layout.tensors.push_back(std::move(t));
  }
  MEMENTO_RETURN_IF_ERROR(CheckEntriesOfOneTensor(layout.tensors));
  layout.data_bytes = offset;
  layout.manifest = EncodeManifest(layout.tensors);
  layout.manifest_offset = kSlotHeaderBytes;
  layout.table_offset = AlignUp(layout.manifest_offset + layout.manifest.size(), 64);
  layout.data_offset =
      AlignUp(layout.table_offset + layout.chunks.size() * sizeof(ChunkEntry), kSlotDataAlignment);
  layout.total_bytes = AlignUp(layout.data_offset + layout.data_bytes, kSlotDataAlignment);
  return layout;
}

std::string EncodeManifest(const std::vector<SavedTensor>& tensors) {
  nlohmann::json arr = nlohmann::json::array();
  for (const SavedTensor& t : tensors) {
    nlohmann::json e = TensorMetaToJson(t.meta);
    e["offset"] = t.offset;
    e["nbytes"] = t.nbytes;
    if (t.ranged || !t.whole()) e["range"] = {{"offset", t.range_offset}, {"length", t.nbytes}};
    if (t.is_parity()) e["parity"] = {{"id", t.parity}};
    arr.push_back(std::move(e));
  }
  int format = 1;
  for (const SavedTensor& t : tensors) {
    if (t.is_parity()) {
      format = 3;
    } else if (t.ranged || !t.whole()) {
      format = std::max(format, 2);
    }
  }
  return nlohmann::json{{"format", format}, {"tensors", arr}}.dump();
}

Result<std::vector<SlotRun>> FindRange(const std::vector<SavedTensor>& entries,
                                       std::string_view tensor, uint64_t offset, uint64_t length) {
  std::vector<const SavedTensor*> mine;
  std::vector<size_t> index;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i].is_parity() && entries[i].meta.name == tensor) {
      mine.push_back(&entries[i]);
      index.push_back(i);
    }
  }
  std::vector<size_t> order(mine.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return mine[a]->range_offset < mine[b]->range_offset; });
  std::vector<SlotRun> runs;
  uint64_t at = offset;
  const uint64_t end = offset + length;
  const bool wraps = end < offset;
  for (size_t k : order) {
    if (wraps || at >= end) break;
    const SavedTensor& t = *mine[k];
    const uint64_t lo = t.range_offset, hi = t.range_offset + t.nbytes;
    if (hi <= at) continue;
    if (lo > at) break;  // a gap at `at`
    const uint64_t take = std::min(end, hi) - at;
    runs.push_back(SlotRun{index[k], t.offset + (at - lo), take});
    at += take;
  }
  if (wraps || at < end) {
    std::string held;
    for (size_t k : order) {
      held += fmt::format("{}[{}, {})", held.empty() ? "" : ", ", mine[k]->range_offset,
                          mine[k]->range_offset + mine[k]->nbytes);
    }
    return NotFoundError(fmt::format(
        "the slot does not hold bytes [{}, +{}) of tensor '{}' (byte {} is missing; it holds {})",
        offset, length, tensor, at, held.empty() ? "no bytes of it" : "bytes " + held));
  }
  return runs;
}

Result<std::vector<SavedTensor>> ParseManifest(std::string_view text) {
  std::vector<SavedTensor> out;
  try {
    auto j = ParseForeignJson(text);
    for (const auto& e : j.at("tensors")) {
      SavedTensor t;
      Result<TensorMeta> meta = TensorMetaFromJson(e);
      if (!meta.ok())
        return DataLossError("slot manifest is not valid: " + meta.status().message());
      t.meta = std::move(*meta);
      t.offset = e.at("offset").get<uint64_t>();
      t.nbytes = e.at("nbytes").get<uint64_t>();
      if (e.contains("range")) {
        const auto& r = e.at("range");
        t.range_offset = r.at("offset").get<uint64_t>();
        t.ranged = true;
        if (r.at("length").get<uint64_t>() != t.nbytes) {
          return DataLossError(
              fmt::format("slot manifest is not valid: tensor '{}' has a {}-byte range in {} bytes",
                          t.meta.name, r.at("length").get<uint64_t>(), t.nbytes));
        }
      }
      if (e.contains("parity")) {
        const uint64_t id = e.at("parity").at("id").get<uint64_t>();
        if (id >= kNoParity) {
          return DataLossError(fmt::format("slot manifest is not valid: parity id {}", id));
        }
        t.parity = static_cast<uint32_t>(id);
      }
      out.push_back(std::move(t));
    }
  } catch (const std::exception& e) {
    return DataLossError(std::string("slot manifest is not valid: ") + e.what());
  }
  return out;
}

std::vector<std::string> DiffTensors(const std::vector<SavedTensor>& saved,
                                     const std::vector<TensorMeta>& registered) {
  std::vector<std::string> diffs;
  std::map<std::string, const TensorMeta*> reg;
  for (const TensorMeta& m : registered) reg[m.name] = &m;
  std::map<std::string, const TensorMeta*> sav;
  for (const SavedTensor& t : saved) {
    if (!t.is_parity()) sav[t.meta.name] = &t.meta;
  }
  for (const auto& [name, s] : sav) {
    auto it = reg.find(name);
    if (it == reg.end()) {
      diffs.push_back(fmt::format("tensor '{}' ({} {}) is saved but not registered", name,
                                  DTypeName(s->dtype), ShapeToString(s->shape)));
      continue;
    }
    const TensorMeta* r = it->second;
    if (s->dtype != r->dtype) {
      diffs.push_back(fmt::format("tensor '{}': dtype {} saved, {} registered", name,
                                  DTypeName(s->dtype), DTypeName(r->dtype)));
    }
    if (s->shape != r->shape) {
      diffs.push_back(fmt::format("tensor '{}': shape {} saved, {} registered", name,
                                  ShapeToString(s->shape), ShapeToString(r->shape)));
    }
  }
  for (const auto& [name, r] : reg) {
    if (sav.count(name) == 0) {
      diffs.push_back(fmt::format("tensor '{}' ({} {}) is registered but not saved", name,
                                  DTypeName(r->dtype), ShapeToString(r->shape)));
    }
  }
  return diffs;
}

void BeginSlotWrite(const Segment& segment, const SlotLayout& layout, int slot_index,
                    int64_t step) {
  SlotHeader* h = Header(segment);
  uint64_t generation = h->generation + 1;
  // kWriting goes out before any other byte of the slot changes: a crash from
  // here on leaves a slot that no reader takes for complete.
  StoreState(h, SlotState::kWriting);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  __atomic_store_n(&h->generation, generation, __ATOMIC_RELAXED);
  h->magic = kSlotMagic;
  h->format_version = kSlotFormatVersion;
  h->header_bytes = kSlotHeaderBytes;
  std::memset(h->job_id, 0, sizeof(h->job_id));
  std::memcpy(h->job_id, layout.job_id.data(), layout.job_id.size());
  h->rank = layout.rank;
  h->slot_index = static_cast<uint32_t>(slot_index);
  h->step = step;
  h->manifest_offset = layout.manifest_offset;
  h->manifest_bytes = layout.manifest.size();
  h->manifest_checksum = Checksum(layout.manifest.data(), layout.manifest.size());
  h->table_offset = layout.table_offset;
  h->num_chunks = layout.chunks.size();
  h->table_checksum = 0;
  h->data_offset = layout.data_offset;
  h->data_bytes = layout.data_bytes;
  h->chunk_bytes = layout.chunk_bytes;
  h->begin_wall_ns = WallNanos();
  h->complete_wall_ns = 0;
  std::memset(h->reserved, 0, sizeof(h->reserved));
  h->header_checksum = 0;
  std::memcpy(segment.data() + layout.manifest_offset, layout.manifest.data(),
              layout.manifest.size());
  if (!layout.chunks.empty()) {
    std::memcpy(segment.data() + layout.table_offset, layout.chunks.data(),
                layout.chunks.size() * sizeof(ChunkEntry));
  }
}

ChunkEntry* SlotTable(const Segment& segment) {
  return reinterpret_cast<ChunkEntry*>(segment.data() + Header(segment)->table_offset);
}

uint8_t* SlotData(const Segment& segment) { return segment.data() + Header(segment)->data_offset; }

void CompleteSlotWrite(const Segment& segment) {
  SlotHeader* h = Header(segment);
  h->table_checksum = Checksum(SlotTable(segment), h->num_chunks * sizeof(ChunkEntry));
  h->complete_wall_ns = WallNanos();
  h->header_checksum = HeaderChecksum(h);
  StoreState(h, SlotState::kComplete);  // release: everything above happens-before
}

Result<SlotInfo> ReadSlot(const Segment& segment) {
  SlotInfo info;
  if (segment.size() < kSlotHeaderBytes) {
    return DataLossError(fmt::format("segment {} is {} bytes, smaller than a slot header",
                                     segment.path(), segment.size()));
  }
  const SlotHeader* live = Header(segment);
  info.state = LoadState(live);
  SlotHeader h;
  std::memcpy(&h, live, sizeof(h));
  std::atomic_thread_fence(std::memory_order_acquire);
  info.generation = h.generation;
  info.step = h.step;
  info.rank = h.rank;
  info.slot_index = static_cast<int>(h.slot_index);
  if (info.state != SlotState::kComplete) return info;
  auto fail = [&](const std::string& what) {
    return DataLossError(fmt::format("slot {} (step {}): {}", segment.path(), h.step, what));
  };
  if (h.magic != kSlotMagic) return fail(fmt::format("bad magic {:#x}", h.magic));
  if (h.format_version != kSlotFormatVersion) {
    return fail(fmt::format("format version {} (this build reads {})", h.format_version,
                            kSlotFormatVersion));
  }
  if (HeaderChecksum(&h) != h.header_checksum) return fail("header checksum mismatch");
  uint64_t size = segment.size();
  auto in_bounds = [size](uint64_t off, uint64_t len) { return off <= size && len <= size - off; };
  if (!in_bounds(h.manifest_offset, h.manifest_bytes) || h.num_chunks > size / sizeof(ChunkEntry) ||
      !in_bounds(h.table_offset, h.num_chunks * sizeof(ChunkEntry)) ||
      !in_bounds(h.data_offset, h.data_bytes)) {
    return fail(fmt::format("layout exceeds the {}-byte segment", size));
  }
  const char* manifest = reinterpret_cast<const char*>(segment.data() + h.manifest_offset);
  if (Checksum(manifest, h.manifest_bytes) != h.manifest_checksum) {
    return fail("manifest checksum mismatch");
  }
  const auto* table = reinterpret_cast<const ChunkEntry*>(segment.data() + h.table_offset);
  if (Checksum(table, h.num_chunks * sizeof(ChunkEntry)) != h.table_checksum) {
    return fail("chunk table checksum mismatch");
  }
  auto tensors = ParseManifest(std::string_view(manifest, h.manifest_bytes));
  if (!tensors.ok()) return fail(tensors.status().message());
  info.tensors = std::move(*tensors);
  info.chunks.assign(table, table + h.num_chunks);
  for (const SavedTensor& t : info.tensors) {
    const uint64_t whole = t.meta.nbytes();
    if (t.offset > h.data_bytes || t.nbytes > h.data_bytes - t.offset || t.range_offset > whole ||
        t.nbytes > whole - t.range_offset || (t.nbytes == 0 && whole != 0)) {
      return fail("tensor " + EntryName(t) + " lies outside the data region or its tensor");
    }
  }
  if (Status st = CheckEntriesOfOneTensor(info.tensors); !st.ok()) return fail(st.message());
  for (const ChunkEntry& c : info.chunks) {
    if (c.offset > h.data_bytes || c.length > h.data_bytes - c.offset ||
        c.tensor_index >= info.tensors.size()) {
      return fail("a chunk lies outside the data region");
    }
  }
  info.job_id.assign(h.job_id, strnlen(h.job_id, sizeof(h.job_id)));
  info.data_bytes = h.data_bytes;
  info.data_offset = h.data_offset;
  info.complete_wall_ns = h.complete_wall_ns;
  return info;
}

Status VerifySlotData(const Segment& segment, const SlotInfo& info) {
  const uint8_t* data = segment.data() + info.data_offset;
  for (size_t i = 0; i < info.chunks.size(); ++i) {
    const ChunkEntry& c = info.chunks[i];
    if (Checksum(data + c.offset, c.length) != c.checksum) {
      return DataLossError(
          fmt::format("slot {} (step {}): chunk {} (bytes {}..{} of tensor {}) fails its checksum",
                      segment.path(), info.step, i, c.offset, c.offset + c.length,
                      EntryName(info.tensors[c.tensor_index])));
    }
  }
  return Status::Ok();
}

Status VerifySlotDataPaced(const Segment& segment, const SlotInfo& info, uint64_t piece_bytes,
                           const std::function<bool(uint64_t)>& pace) {
  const uint8_t* data = segment.data() + info.data_offset;
  StreamingChecksum sum;
  for (size_t i = 0; i < info.chunks.size(); ++i) {
    const ChunkEntry& c = info.chunks[i];
    sum.Reset();
    for (uint64_t done = 0; done < c.length;) {
      uint64_t n = std::min<uint64_t>(piece_bytes, c.length - done);
      if (pace && !pace(n)) {
        return AbortedError(
            fmt::format("verification of slot {} (step {}) stopped", segment.path(), info.step));
      }
      sum.Update(data + c.offset + done, n);
      done += n;
    }
    if (sum.Digest() != c.checksum) {
      return DataLossError(
          fmt::format("slot {} (step {}): chunk {} (bytes {}..{} of tensor {}) fails its checksum",
                      segment.path(), info.step, i, c.offset, c.offset + c.length,
                      EntryName(info.tensors[c.tensor_index])));
    }
  }
  return Status::Ok();
}

void LoadSlotVersion(const Segment& segment, SlotState* state, uint64_t* generation) {
  if (segment.size() < kSlotHeaderBytes) {
    // No header to read (a short file): ReadSlot reports it as DataLoss.
    *state = SlotState::kEmpty;
    *generation = 0;
    return;
  }
  const SlotHeader* h = Header(segment);
  *state = LoadState(h);
  *generation = __atomic_load_n(&h->generation, __ATOMIC_ACQUIRE);
}

bool SlotUnchanged(const Segment& segment, const SlotInfo& info) {
  if (segment.size() < kSlotHeaderBytes) return false;
  std::atomic_thread_fence(std::memory_order_acquire);
  const SlotHeader* h = Header(segment);
  SlotState state = LoadState(h);
  uint64_t gen = __atomic_load_n(&h->generation, __ATOMIC_ACQUIRE);
  return state == info.state && gen == info.generation;
}

namespace {

// ReadSlot + the seqlock re-check; the why-not goes to `why` (for NotFound).
std::optional<SlotInfo> ReadCompleteSlot(const Segment* segment, int slot, std::string* why) {
  if (segment == nullptr) {
    *why += fmt::format(" slot {}: absent;", slot);
    return std::nullopt;
  }
  Result<SlotInfo> info = ReadSlot(*segment);
  if (!info.ok()) {
    *why += fmt::format(" slot {}: {};", slot, info.status().message());
    return std::nullopt;
  }
  if (info->state != SlotState::kComplete) {
    *why += fmt::format(" slot {}: {} step {};", slot, SlotStateName(info->state), info->step);
    return std::nullopt;
  }
  if (!SlotUnchanged(*segment, *info)) {
    *why += fmt::format(" slot {}: rewritten while read;", slot);
    return std::nullopt;
  }
  return std::move(*info);
}

}  // namespace

Result<CompleteSlot> FindCompleteSlot(const RankSlots& slots, int64_t step) {
  std::string why;
  for (int s = 0; s < kSlotsPerRank; ++s) {
    // The header says kComplete with this step before anything is parsed.
    if (slots[s] != nullptr) {
      const SlotPeek peek = PeekSlot(*slots[s]);
      if (peek.state == SlotState::kComplete && peek.step != step) {
        why += fmt::format(" slot {}: complete step {};", s, peek.step);
        continue;
      }
    }
    std::optional<SlotInfo> info = ReadCompleteSlot(slots[s], s, &why);
    if (!info) continue;
    if (info->step != step) {
      why += fmt::format(" slot {}: complete step {};", s, info->step);
      continue;
    }
    return CompleteSlot{s, std::move(*info)};
  }
  if (!why.empty()) why.pop_back();
  return NotFoundError(fmt::format("no slot holds step {} complete:{}", step, why));
}

Result<CompleteSlot> FindNewestCompleteSlot(const RankSlots& slots) {
  std::optional<CompleteSlot> best;
  std::string why;
  for (int s = 0; s < kSlotsPerRank; ++s) {
    std::optional<SlotInfo> info = ReadCompleteSlot(slots[s], s, &why);
    if (!info) continue;
    if (!best || info->step > best->info.step) best = CompleteSlot{s, std::move(*info)};
  }
  if (!best) {
    if (!why.empty()) why.pop_back();
    return NotFoundError(fmt::format("no slot holds a complete step:{}", why));
  }
  return std::move(*best);
}

SlotPeek PeekSlot(const Segment& segment) {
  SlotPeek peek;
  if (segment.size() < kSlotHeaderBytes) return peek;
  const SlotHeader* h = Header(segment);
  peek.state = LoadState(h);
  peek.step = __atomic_load_n(&h->step, __ATOMIC_ACQUIRE);
  peek.generation = __atomic_load_n(&h->generation, __ATOMIC_ACQUIRE);
  return peek;
}

SlotPeek PeekSlotFile(const std::string& path) {
  SlotPeek peek;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return peek;
  SlotHeader h{};
  if (pread(fd, &h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h))) {
    peek.state = static_cast<SlotState>(h.state);
    peek.step = h.step;
    peek.generation = h.generation;
  }
  close(fd);
  return peek;
}

}  // namespace memento::shm
