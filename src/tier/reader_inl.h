// Template bodies of reader.h. Include reader.h, not this file.
#pragma once

#include <fmt/format.h>

#include <algorithm>

#include "common/checksum.h"

namespace memento::tier::internal {

template <typename Sink>
Status ReadPiece(RandomAccessFile* file, const PieceRecord& p, AlignedBuffer* buffer,
                 const std::string& what, Sink&& sink, uint64_t* bytes_read) {
  StreamingChecksum cs;
  const uint64_t begin = p.file_offset;
  const uint64_t end = p.file_offset + p.length;
  uint64_t pos = AlignDown(begin, kDirectIoAlignment);
  const uint64_t stop = AlignUp(end, kDirectIoAlignment);
  while (pos < end) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(buffer->size(), stop - pos));
    MEMENTO_ASSIGN_OR_RETURN(size_t n, file->Read(pos, buffer->data(), want));
    uint64_t lo = std::max(pos, begin);
    uint64_t hi = std::min(pos + n, end);
    if (hi > lo) {
      const uint8_t* bytes = buffer->data() + (lo - pos);
      cs.Update(bytes, hi - lo);
      sink(p.tensor_offset + (lo - begin), bytes, static_cast<size_t>(hi - lo));
    }
    *bytes_read += n;
    pos += n;
    if (n < want && pos < end) {
      return DataLossError(fmt::format(
          "{}: piece '{}' needs bytes up to {} but the file ends at {}", what, p.key, end, pos));
    }
  }
  uint64_t got = cs.Digest();
  if (got != p.xxh3) {
    return DataLossError(fmt::format(
        "{}: piece '{}' (bytes {}..{} of the file) fails its checksum: xxh3 {} stored {}", what,
        p.key, begin, end, HexU64(got), HexU64(p.xxh3)));
  }
  return Status::Ok();
}

}  // namespace memento::tier::internal
