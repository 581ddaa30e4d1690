#include "tier/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/json_parse.h"
#include "memento/types.h"

namespace memento::tier {

using nlohmann::json;

namespace {
// The safetensors reference implementation refuses headers above 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Reads [offset, offset + len) into `out`, through an aligned bounce buffer
// when the file is opened for direct I/O.
Result<size_t> ReadAt(RandomAccessFile* file, uint64_t offset, size_t len, void* out) {
  if (!file->direct()) return file->Read(offset, out, len);
  uint64_t begin = AlignDown(offset, kDirectIoAlignment);
  uint64_t end = AlignUp(offset + len, kDirectIoAlignment);
  AlignedBuffer buf(end - begin);
  MEMENTO_ASSIGN_OR_RETURN(size_t n, file->Read(begin, buf.data(), end - begin));
  if (n <= offset - begin) return size_t{0};
  size_t got = std::min<size_t>(len, n - (offset - begin));
  std::memcpy(out, buf.data() + (offset - begin), got);
  return got;
}

}  // namespace

std::string EncodeSafetensorsHeader(const std::vector<SafetensorsEntry>& entries,
                                    const std::map<std::string, std::string>& metadata,
                                    size_t align) {
  json j = json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  for (const auto& e : entries) {
    j[e.key] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = j.dump();
  size_t total = 8 + text.size();
  align = std::max<size_t>(align, 8);
  text.append((align - total % align) % align, ' ');
  uint64_t n = text.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);  // little-endian
  out += text;
  return out;
}

Result<SafetensorsHeader> ReadSafetensorsHeader(RandomAccessFile* file, uint64_t file_size,
                                                const std::string& what) {
  if (file_size < 8) {
    return DataLossError(
        fmt::format("{}: {} bytes, too short for a safetensors file", what, file_size));
  }
  uint8_t len_bytes[8];
  MEMENTO_ASSIGN_OR_RETURN(size_t got, ReadAt(file, 0, 8, len_bytes));
  if (got != 8) return DataLossError(what + ": cannot read the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxHeaderBytes || 8 + n > file_size) {
    return DataLossError(
        fmt::format("{}: header length {} does not fit the file of {} bytes", what, n, file_size));
  }
  std::string text(n, '\0');
  MEMENTO_ASSIGN_OR_RETURN(got, ReadAt(file, 8, n, text.data()));
  if (got != n) return DataLossError(what + ": short read of the header");
  SafetensorsHeader h;
  h.data_start = 8 + n;
  try {
    json j = ParseForeignJson(text);
    if (!j.is_object()) return DataLossError(what + ": header is not a JSON object");
    for (const auto& [key, v] : j.items()) {
      if (key == "__metadata__") {
        for (const auto& [mk, mv] : v.items()) h.metadata[mk] = mv.get<std::string>();
        continue;
      }
      SafetensorsEntry e;
      e.key = key;
      e.dtype = v.at("dtype").get<std::string>();
      e.shape = v.at("shape").get<std::vector<int64_t>>();
      auto offs = v.at("data_offsets").get<std::vector<uint64_t>>();
      if (offs.size() != 2 || offs[1] < offs[0]) {
        return DataLossError(fmt::format("{}: tensor '{}' has bad data_offsets", what, key));
      }
      e.begin = offs[0];
      e.end = offs[1];
      auto dt = ParseDType(e.dtype);
      if (!dt.ok())
        return DataLossError(
            fmt::format("{}: tensor '{}': unknown dtype '{}'", what, key, e.dtype));
      uint64_t numel = 1;
      for (int64_t d : e.shape) {
        if (d < 0)
          return DataLossError(fmt::format("{}: tensor '{}' has a negative dim", what, key));
        if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
          return DataLossError(
              fmt::format("{}: tensor '{}' has more than 2^64 elements", what, key));
        }
      }
      uint64_t nbytes = 0;
      if (__builtin_mul_overflow(numel, DTypeSize(*dt), &nbytes)) {
        return DataLossError(fmt::format("{}: tensor '{}' has more than 2^64 bytes", what, key));
      }
      if (nbytes != e.end - e.begin) {
        return DataLossError(fmt::format("{}: tensor '{}': {} {} needs {} bytes, offsets give {}",
                                         what, key, e.dtype, ShapeToString(e.shape),
                                         numel * DTypeSize(*dt), e.end - e.begin));
      }
      h.entries.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    return DataLossError(what + ": malformed safetensors header: " + e.what());
  }
  std::sort(h.entries.begin(), h.entries.end(),
            [](const auto& a, const auto& b) { return a.begin < b.begin; });
  uint64_t expect = 0;
  for (const auto& e : h.entries) {
    if (e.begin != expect) {
      return DataLossError(fmt::format("{}: tensor '{}' starts at {}, expected {} (gap or overlap)",
                                       what, e.key, e.begin, expect));
    }
    expect = e.end;
  }
  if (h.data_start + expect != file_size) {
    return DataLossError(fmt::format("{}: tensors end at byte {} but the file has {} bytes", what,
                                     h.data_start + expect, file_size));
  }
  return h;
}

}  // namespace memento::tier
