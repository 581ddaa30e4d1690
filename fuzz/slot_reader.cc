// Fuzz target: the slot header and chunk table reader (shm::ReadSlot, then
// VerifySlotData and VerifySlotDataPaced on what it accepted), on a real
// shared-memory file: the input is the segment's bytes (padded to one
// header). The header's `pad` word (not covered by any checksum) steers the
// harness: bit 0 recomputes the manifest, table and header checksums after
// the fuzzer's changes (so inputs reach the layout and manifest checks behind
// them), bit 1 sets the state to kComplete. MEMENTO_FUZZ_WRITE_SEED=PATH
// writes a valid slot written by the real writer to PATH (the corpus seed).
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "shm/segment.h"
#include "shm/slot.h"
#include "shm/slot_format.h"

namespace {

using namespace memento;
using namespace memento::shm;

std::string SegmentPath() {
  static const std::string path = "/dev/shm/memento-fuzz-slot-" + std::to_string(getpid());
  return path;
}

void WriteSeed(const char* out) {
  std::vector<TensorMeta> metas(2);
  metas[0].name = "w";
  metas[0].dtype = DType::kFloat32;
  metas[0].shape = {64};
  metas[1].name = "opt";
  metas[1].dtype = DType::kInt64;
  metas[1].shape = {8};
  metas[1].state_class = StateClass::kDpSharded;
  metas[1].global_numel = 32;
  metas[1].shard_offset = 8;
  auto layout = ComputeSlotLayout("fuzzjob", 1, metas, 128);
  if (!layout.ok()) std::abort();
  const std::string path = SegmentPath() + "-seed";
  auto seg = Segment::CreateOrGrow(path, layout->total_bytes);
  if (!seg.ok()) std::abort();
  BeginSlotWrite(**seg, *layout, 0, 7);
  ChunkEntry* table = SlotTable(**seg);
  uint8_t* data = SlotData(**seg);
  for (size_t i = 0; i < layout->chunks.size(); ++i) {
    table[i] = layout->chunks[i];
    for (uint64_t b = 0; b < table[i].length; ++b) data[table[i].offset + b] = uint8_t(b * 7 + i);
    table[i].checksum = Checksum(data + table[i].offset, table[i].length);
  }
  CompleteSlotWrite(**seg);
  std::ofstream(out, std::ios::binary)
      .write(reinterpret_cast<const char*>((*seg)->data()),
             static_cast<std::streamsize>(layout->total_bytes));
  unlink(path.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (const char* seed = std::getenv("MEMENTO_FUZZ_WRITE_SEED")) {
    static bool written = false;
    if (!written) WriteSeed(seed);
    written = true;
  }
  if (size > (size_t{4} << 20)) return 0;
  std::vector<uint8_t> image(std::max(size, kSlotHeaderBytes), 0);
  std::memcpy(image.data(), data, size);
  auto* h = reinterpret_cast<SlotHeader*>(image.data());
  const uint64_t total = image.size();
  auto in_bounds = [total](uint64_t off, uint64_t len) {
    return off <= total && len <= total - off;
  };
  if (h->pad & 2) h->state = static_cast<uint32_t>(SlotState::kComplete);
  if (h->pad & 1) {
    if (in_bounds(h->manifest_offset, h->manifest_bytes)) {
      h->manifest_checksum = Checksum(image.data() + h->manifest_offset, h->manifest_bytes);
    }
    if (h->num_chunks <= total / sizeof(ChunkEntry) &&
        in_bounds(h->table_offset, h->num_chunks * sizeof(ChunkEntry))) {
      h->table_checksum =
          Checksum(image.data() + h->table_offset, h->num_chunks * sizeof(ChunkEntry));
    }
    h->header_checksum = Checksum(h, offsetof(SlotHeader, header_checksum));
  }
  const std::string path = SegmentPath();
  {
    const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    if (fd < 0) std::abort();
    size_t done = 0;
    while (done < image.size()) {
      const ssize_t n = write(fd, image.data() + done, image.size() - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    close(fd);
  }
  auto seg = Segment::Open(path, /*writable=*/false);
  if (seg.ok()) {
    auto info = ReadSlot(**seg);
    if (info.ok() && info->state == SlotState::kComplete) {
      (void)VerifySlotData(**seg, *info);
      (void)VerifySlotDataPaced(**seg, *info, 100, [](uint64_t) { return true; });
      (void)SlotUnchanged(**seg, *info);
    }
  }
  unlink(path.c_str());
  return 0;
}
