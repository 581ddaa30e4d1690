// Erasure codes for in-memory redundancy: XOR parity (REFT AEC) and
// Reed-Solomon over GF(2^8) with a Cauchy generator (beyond REFT), both on
// ISA-L. See docs/codecs.md.
//
// A code has k data blocks and f parity blocks of equal length. It is
// systematic and MDS: any k of the k + f blocks determine all of them. The
// code is byte-wise (byte i of a parity depends only on byte i of the data),
// so callers may encode or decode a block in chunks of any size and at any
// offset: pieces of many GiB stream through a small buffer, and no call needs
// a second full-size buffer.
//
// Thread safety: ErasureCode and Decoder are immutable after creation; their
// const methods may be called from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "memento/status.h"

namespace memento::codec {

enum class CodeKind : uint8_t {
  kXor = 0,  // f == 1, parity = XOR of the data (REFT Eq. 1)
  kRs = 1,   // f >= 1, parity rows from gf_gen_cauchy1_matrix
};

std::string_view CodeKindName(CodeKind kind);  // "xor", "rs"

// Largest k + f supported (GF(2^8) Cauchy matrices stay MDS up to 256 rows;
// ISA-L's tables are sized for at most 255).
inline constexpr int kMaxBlocks = 255;

class Decoder;

class ErasureCode {
 public:
  // k >= 1, f >= 1, k + f <= kMaxBlocks; kXor requires f == 1.
  // InvalidArgument otherwise.
  [[nodiscard]] static Result<ErasureCode> Create(CodeKind kind, int k, int f);

  CodeKind kind() const { return kind_; }
  int k() const { return k_; }
  int f() const { return f_; }
  // The (k + f) x k generator matrix, row-major; rows 0..k-1 are the identity.
  const std::vector<uint8_t>& matrix() const { return matrix_; }

  // parity[j][0..len) = row k + j of the matrix applied to data[0..k-1][0..len).
  // Any alignment and any len (0 included). Buffers must not overlap.
  // Chunked use: calling Encode on [off, off + n) sub-ranges of every block
  // gives the same bytes as one call over the whole length.
  void Encode(size_t len, const uint8_t* const* data, uint8_t* const* parity) const;

  // A decoder that rebuilds blocks `wanted` (indices in [0, k + f): data
  // 0..k-1, parity k..k+f-1) from exactly k distinct `available` blocks.
  // InvalidArgument when indices are out of range, repeated, or fewer/more
  // than k are available.
  [[nodiscard]] Result<Decoder> MakeDecoder(const std::vector<int>& available,
                                            const std::vector<int>& wanted) const;

 private:
  ErasureCode() = default;
  CodeKind kind_ = CodeKind::kRs;
  int k_ = 0;
  int f_ = 0;
  std::vector<uint8_t> matrix_;  // (k + f) x k
  std::vector<uint8_t> tables_;  // ec_init_tables for the f parity rows
};

// Rebuilds blocks from k available ones; made by ErasureCode::MakeDecoder.
class Decoder {
 public:
  const std::vector<int>& available() const { return available_; }
  const std::vector<int>& wanted() const { return wanted_; }

  // out[i][0..len) = block wanted()[i], computed from in[j] = block
  // available()[j]. Byte-wise like Encode, so it may be called per chunk.
  void Decode(size_t len, const uint8_t* const* in, uint8_t* const* out) const;

 private:
  friend class ErasureCode;
  Decoder() = default;
  bool xor_only_ = false;  // every wanted row is the XOR of all inputs
  std::vector<int> available_;
  std::vector<int> wanted_;
  std::vector<uint8_t> rows_;    // wanted.size() x k, over the available blocks
  std::vector<uint8_t> tables_;  // ec_init_tables(k, wanted.size(), rows_)
};

// XOR of `n` sources into dest over len bytes, on ISA-L xor_gen where the
// alignment allows, any alignment otherwise. dest may not alias a source.
void XorInto(size_t len, const uint8_t* const* sources, int n, uint8_t* dest);

// Encodes blocks of `len` bytes that the caller produces and consumes chunk by
// chunk (for example straight from a snapshot slot into a parity slot), never
// holding more than `chunk_bytes` of scratch per block.
//   fill(offset, n, data_chunks): write n bytes of each data block at offset
//       into data_chunks[i] (k buffers of chunk_bytes)
//   sink(offset, n, parity_chunks): consume n bytes of each parity block
// Both return Status; the first error stops the stream and is returned.
template <typename Fill, typename Sink>
Status EncodeStream(const ErasureCode& code, size_t len, size_t chunk_bytes, Fill&& fill,
                    Sink&& sink);

// The same for decoding (the recovery executor's path): `fill` writes n bytes
// of each of the k available blocks at offset (decoder.available() order),
// `sink` consumes n bytes of each wanted block.
template <typename Fill, typename Sink>
Status DecodeStream(const Decoder& decoder, size_t len, size_t chunk_bytes, Fill&& fill,
                    Sink&& sink);

}  // namespace memento::codec

#include "codec/erasure_code_inl.h"
