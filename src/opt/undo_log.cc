#include "opt/undo_log.h"

#include <bitset>
#include <cstring>

#include "common/check.h"
#include "common/checksum.h"

namespace memento::opt {
namespace {

constexpr char kMagic[8] = {'M', 'M', 'U', 'N', 'D', 'O', 'L', '1'};
constexpr uint32_t kVersion = 1;

// Encoded layout (little-endian, fixed): LogHeader, then num_entries
// EntryRecord, then the values of every entry in order.
struct LogHeader {
  char magic[8];
  uint32_t version;
  int32_t num_buffers;
  int64_t step;
  float lr;
  uint32_t reserved;
  uint64_t num_entries;
  uint64_t num_values;
};
static_assert(sizeof(LogHeader) == 48, "LogHeader is encoded raw");

struct EntryRecord {
  uint64_t offset;
  uint64_t count;
  uint32_t mask;
  uint32_t reserved;
  uint64_t position;
  uint64_t checksum;
};
static_assert(sizeof(EntryRecord) == 40, "EntryRecord is encoded raw");

int Popcount(uint32_t mask) { return static_cast<int>(std::bitset<32>(mask).count()); }

}  // namespace

UndoLog::UndoLog(int num_buffers) : num_buffers_(num_buffers) {
  MEMENTO_CHECK(num_buffers >= 1 && num_buffers <= 32);
}

void UndoLog::Begin(int64_t step, float lr) {
  step_ = step;
  lr_ = lr;
  entries_.clear();
  values_.clear();
}

uint64_t UndoLog::EntryChecksum(const Entry& e) const {
  const uint64_t header[3] = {e.offset, e.count, e.mask};
  uint64_t h = Checksum(header, sizeof(header));
  const size_t n = static_cast<size_t>(e.count) * Popcount(e.mask);
  return ChecksumWithSeed(values_.data() + e.position, n * sizeof(float), h);
}

Status UndoLog::BeforeWrite(uint64_t offset, uint64_t count, const float* const* buffers,
                            int num_buffers) {
  if (num_buffers != num_buffers_) {
    return InvalidArgumentError("undo log: a chunk of " + std::to_string(num_buffers) +
                                " buffers, the log holds " + std::to_string(num_buffers_));
  }
  Entry e;
  e.offset = offset;
  e.count = count;
  e.mask = num_buffers_ == 32 ? 0xffffffffu : ((1u << num_buffers_) - 1);
  e.position = values_.size();
  for (int b = 0; b < num_buffers_; ++b)
    values_.insert(values_.end(), buffers[b], buffers[b] + count);
  e.checksum = EntryChecksum(e);
  entries_.push_back(e);
  return Status::Ok();
}

Status UndoLog::RecordBuffer(int buffer, uint64_t offset, uint64_t count, const float* values) {
  if (buffer < 0 || buffer >= num_buffers_) {
    return InvalidArgumentError("undo log: buffer " + std::to_string(buffer) + " outside [0, " +
                                std::to_string(num_buffers_) + ")");
  }
  Entry e;
  e.offset = offset;
  e.count = count;
  e.mask = 1u << buffer;
  e.position = values_.size();
  values_.insert(values_.end(), values, values + count);
  e.checksum = EntryChecksum(e);
  entries_.push_back(e);
  return Status::Ok();
}

Status UndoLog::VerifyEntry(size_t i) const {
  const Entry& e = entries_[i];
  const uint64_t n = e.count * static_cast<uint64_t>(Popcount(e.mask));
  if (e.position > values_.size() || n > values_.size() - e.position) {
    return DataLossError("undo log of step " + std::to_string(step_) + ": entry " +
                         std::to_string(i) + " points past the logged values");
  }
  if (EntryChecksum(e) != e.checksum) {
    return DataLossError("undo log of step " + std::to_string(step_) + ": entry " +
                         std::to_string(i) + " (elements " + std::to_string(e.offset) + "+" +
                         std::to_string(e.count) + ") fails its checksum");
  }
  return Status::Ok();
}

Status UndoLog::Verify() const {
  for (size_t i = 0; i < entries_.size(); ++i) MEMENTO_RETURN_IF_ERROR(VerifyEntry(i));
  return Status::Ok();
}

Status UndoLog::Undo(const std::vector<UndoTarget>& targets) const {
  if (targets.size() != static_cast<size_t>(num_buffers_)) {
    return InvalidArgumentError("undo log: " + std::to_string(targets.size()) +
                                " targets, the log holds " + std::to_string(num_buffers_) +
                                " buffers");
  }
  // Check everything first: a bad log must not leave a half-undone rank.
  for (size_t i = 0; i < entries_.size(); ++i) {
    MEMENTO_RETURN_IF_ERROR(VerifyEntry(i));
    const Entry& e = entries_[i];
    for (int b = 0; b < num_buffers_; ++b) {
      if ((e.mask & (1u << b)) == 0) continue;
      const UndoTarget& t = targets[b];
      if (t.data == nullptr || e.offset < t.first || e.offset + e.count > t.first + t.count) {
        return InvalidArgumentError("undo log of step " + std::to_string(step_) + ": entry " +
                                    std::to_string(i) + " (elements " + std::to_string(e.offset) +
                                    "+" + std::to_string(e.count) + ") lies outside buffer " +
                                    std::to_string(b) + " [" + std::to_string(t.first) + ", " +
                                    std::to_string(t.first + t.count) + ")");
      }
    }
  }
  // Newest first: where entries overlap the oldest value wins.
  for (size_t i = entries_.size(); i-- > 0;) {
    const Entry& e = entries_[i];
    const float* src = values_.data() + e.position;
    for (int b = 0; b < num_buffers_; ++b) {
      if ((e.mask & (1u << b)) == 0) continue;
      std::memcpy(targets[b].data + (e.offset - targets[b].first), src, e.count * sizeof(float));
      src += e.count;
    }
  }
  return Status::Ok();
}

Status UndoLog::Undo(const Shard& shard) const {
  std::vector<UndoTarget> targets;
  targets.push_back({shard.params, shard.offset, shard.count});
  for (float* s : shard.state) targets.push_back({s, shard.offset, shard.count});
  return Undo(targets);
}

uint64_t UndoLog::covered(int buffer) const {
  uint64_t n = 0;
  for (const Entry& e : entries_)
    if (e.mask & (1u << buffer)) n += e.count;
  return n;
}

void UndoLog::CorruptForTest(size_t entry) {
  MEMENTO_CHECK(entry < entries_.size() && entries_[entry].count > 0);
  uint32_t bits;
  float* f = values_.data() + entries_[entry].position;
  std::memcpy(&bits, f, sizeof(bits));
  bits ^= 1u << 7;
  std::memcpy(f, &bits, sizeof(bits));
}

std::string UndoLog::Encode() const {
  LogHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.num_buffers = num_buffers_;
  h.step = step_;
  h.lr = lr_;
  h.num_entries = entries_.size();
  h.num_values = values_.size();
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  for (const Entry& e : entries_) {
    EntryRecord r;
    std::memset(&r, 0, sizeof(r));
    r.offset = e.offset;
    r.count = e.count;
    r.mask = e.mask;
    r.position = e.position;
    r.checksum = e.checksum;
    out.append(reinterpret_cast<const char*>(&r), sizeof(r));
  }
  out.append(reinterpret_cast<const char*>(values_.data()), values_.size() * sizeof(float));
  return out;
}

Result<UndoLog> UndoLog::Decode(std::string_view bytes) {
  LogHeader h;
  if (bytes.size() < sizeof(h)) {
    return InvalidArgumentError("undo log: " + std::to_string(bytes.size()) +
                                " bytes, shorter than its header (" + std::to_string(sizeof(h)) +
                                ")");
  }
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0)
    return InvalidArgumentError("undo log: bad magic (not an MMUNDOL1 log)");
  if (h.version != kVersion) {
    return InvalidArgumentError("undo log: version " + std::to_string(h.version) +
                                ", this build reads " + std::to_string(kVersion));
  }
  if (h.num_buffers < 1 || h.num_buffers > 32) {
    return InvalidArgumentError("undo log: num_buffers " + std::to_string(h.num_buffers) +
                                " outside [1, 32]");
  }
  const uint64_t body = bytes.size() - sizeof(h);
  if (h.num_entries > body / sizeof(EntryRecord) ||
      h.num_values != (body - h.num_entries * sizeof(EntryRecord)) / sizeof(float) ||
      (body - h.num_entries * sizeof(EntryRecord)) % sizeof(float) != 0) {
    return DataLossError("undo log: " + std::to_string(bytes.size()) + " bytes do not hold " +
                         std::to_string(h.num_entries) + " entries and " +
                         std::to_string(h.num_values) + " values (truncated?)");
  }
  UndoLog log(h.num_buffers);
  log.step_ = h.step;
  log.lr_ = h.lr;
  const uint32_t all = h.num_buffers == 32 ? 0xffffffffu : ((1u << h.num_buffers) - 1);
  const char* p = bytes.data() + sizeof(h);
  for (uint64_t i = 0; i < h.num_entries; ++i, p += sizeof(EntryRecord)) {
    EntryRecord r;
    std::memcpy(&r, p, sizeof(r));
    if (r.mask == 0 || (r.mask & ~all) != 0) {
      return InvalidArgumentError("undo log: entry " + std::to_string(i) + " has buffer mask " +
                                  std::to_string(r.mask) + " for " + std::to_string(h.num_buffers) +
                                  " buffers");
    }
    log.entries_.push_back(Entry{r.offset, r.count, r.mask, r.position, r.checksum});
  }
  log.values_.resize(h.num_values);
  std::memcpy(log.values_.data(), p, h.num_values * sizeof(float));
  return log;
}

}  // namespace memento::opt
