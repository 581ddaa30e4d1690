// The safetensors container (https://huggingface.co/docs/safetensors): an
// 8-byte little-endian header length N, N bytes of JSON, then the raw tensor
// bytes. Each header entry is {"dtype", "shape", "data_offsets": [begin, end]}
// with offsets relative to the first byte after the header; entries cover the
// data region without gaps. "__metadata__" maps strings to strings.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "memento/status.h"
#include "tier/env.h"

namespace memento::tier {

struct SafetensorsEntry {
  std::string key;
  std::string dtype;  // "F32", "BF16", "U8", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // relative to SafetensorsHeader::data_start
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                // 8 + header length
  std::vector<SafetensorsEntry> entries;  // sorted by begin
  std::map<std::string, std::string> metadata;
};

// The first data_start bytes of a file (length prefix + JSON, padded with
// spaces, which the format allows, so that the data starts at a multiple of
// `align`: 8 at least, 4096 lets direct I/O write aligned tensors straight from
// memory). REQUIRES: entries are contiguous from 0; align is a power of 2.
std::string EncodeSafetensorsHeader(const std::vector<SafetensorsEntry>& entries,
                                    const std::map<std::string, std::string>& metadata,
                                    size_t align = 8);

// Parses and validates the header of `file` (`what` names it in errors):
// well-formed JSON, known dtypes, byte counts matching dtype x shape, entries
// without gaps or overlaps, and a data region that ends exactly at `file_size`.
Result<SafetensorsHeader> ReadSafetensorsHeader(RandomAccessFile* file, uint64_t file_size,
                                                const std::string& what);

}  // namespace memento::tier
