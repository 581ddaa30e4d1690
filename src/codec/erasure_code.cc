#include "codec/erasure_code.h"

#include <isa-l/erasure_code.h>
#include <isa-l/raid.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "common/check.h"

namespace memento::codec {
namespace {

// ISA-L takes int lengths; larger blocks go through in 1 GiB steps.
constexpr size_t kMaxIsalLen = size_t{1} << 30;

bool Aligned32(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 31) == 0; }

// dest ^= src over n bytes, portable (used for tails and unaligned buffers).
void XorAccumulate(size_t n, const uint8_t* src, uint8_t* dest) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t a, b;
    std::memcpy(&a, src + i, 8);
    std::memcpy(&b, dest + i, 8);
    b ^= a;
    std::memcpy(dest + i, &b, 8);
  }
  for (; i < n; ++i) dest[i] ^= src[i];
}

void PortableXor(size_t len, const uint8_t* const* sources, int n, uint8_t* dest) {
  std::memcpy(dest, sources[0], len);
  for (int i = 1; i < n; ++i) XorAccumulate(len, sources[i], dest);
}

// Applies `rows` (r x k coefficient rows, prepared into `tables`) to k inputs.
void ApplyTables(size_t len, int k, int r, const std::vector<uint8_t>& tables,
                 const uint8_t* const* in, uint8_t* const* out) {
  std::vector<uint8_t*> src(k), dst(r);
  for (size_t off = 0; off < len; off += kMaxIsalLen) {
    const size_t n = std::min(kMaxIsalLen, len - off);
    for (int i = 0; i < k; ++i) src[i] = const_cast<uint8_t*>(in[i]) + off;
    for (int j = 0; j < r; ++j) dst[j] = out[j] + off;
    ec_encode_data(static_cast<int>(n), k, r, const_cast<uint8_t*>(tables.data()), src.data(),
                   dst.data());
  }
}

}  // namespace

std::string_view CodeKindName(CodeKind kind) { return kind == CodeKind::kXor ? "xor" : "rs"; }

void XorInto(size_t len, const uint8_t* const* sources, int n, uint8_t* dest) {
  MEMENTO_CHECK(n >= 1);
  if (len == 0) return;
  if (n == 1) {
    std::memcpy(dest, sources[0], len);
    return;
  }
  bool aligned = Aligned32(dest);
  for (int i = 0; i < n && aligned; ++i) aligned = Aligned32(sources[i]);
  if (!aligned) {
    PortableXor(len, sources, n, dest);
    return;
  }
  // xor_gen wants 32-byte aligned vectors; run it on the 64-byte multiple and
  // finish the tail by hand.
  const size_t bulk = len & ~size_t{63};
  std::vector<void*> array(n + 1);
  for (size_t off = 0; off < bulk; off += kMaxIsalLen) {
    const size_t step = std::min(kMaxIsalLen, bulk - off);
    for (int i = 0; i < n; ++i) array[i] = const_cast<uint8_t*>(sources[i]) + off;
    array[n] = dest + off;
    MEMENTO_CHECK(xor_gen(n + 1, static_cast<int>(step), array.data()) == 0);
  }
  if (bulk < len) {
    std::vector<const uint8_t*> tails(n);
    for (int i = 0; i < n; ++i) tails[i] = sources[i] + bulk;
    PortableXor(len - bulk, tails.data(), n, dest + bulk);
  }
}

Result<ErasureCode> ErasureCode::Create(CodeKind kind, int k, int f) {
  if (k < 1 || f < 1 || k + f > kMaxBlocks) {
    return InvalidArgumentError("erasure code k=" + std::to_string(k) + " f=" + std::to_string(f) +
                                ": need k >= 1, f >= 1, k + f <= " + std::to_string(kMaxBlocks));
  }
  if (kind == CodeKind::kXor && f != 1) {
    return InvalidArgumentError("xor code with f=" + std::to_string(f) +
                                ": XOR parity tolerates exactly one erasure (use rs)");
  }
  ErasureCode code;
  code.kind_ = kind;
  code.k_ = k;
  code.f_ = f;
  const int m = k + f;
  code.matrix_.assign(static_cast<size_t>(m) * k, 0);
  if (kind == CodeKind::kXor) {
    for (int i = 0; i < k; ++i) code.matrix_[static_cast<size_t>(i) * k + i] = 1;
    std::fill(code.matrix_.begin() + static_cast<size_t>(k) * k, code.matrix_.end(), 1);
  } else {
    gf_gen_cauchy1_matrix(code.matrix_.data(), m, k);
  }
  code.tables_.resize(static_cast<size_t>(32) * k * f);
  ec_init_tables(k, f, code.matrix_.data() + static_cast<size_t>(k) * k, code.tables_.data());
  return code;
}

void ErasureCode::Encode(size_t len, const uint8_t* const* data, uint8_t* const* parity) const {
  if (len == 0) return;
  if (kind_ == CodeKind::kXor) {
    XorInto(len, data, k_, parity[0]);
    return;
  }
  ApplyTables(len, k_, f_, tables_, data, parity);
}

Result<Decoder> ErasureCode::MakeDecoder(const std::vector<int>& available,
                                         const std::vector<int>& wanted) const {
  const int m = k_ + f_;
  if (static_cast<int>(available.size()) != k_) {
    return InvalidArgumentError("decoder needs exactly k=" + std::to_string(k_) +
                                " available blocks, got " + std::to_string(available.size()));
  }
  std::vector<bool> seen(m, false);
  for (int a : available) {
    if (a < 0 || a >= m || seen[a]) {
      return InvalidArgumentError("decoder: available block index " + std::to_string(a) +
                                  " out of range [0, " + std::to_string(m) + ") or repeated");
    }
    seen[a] = true;
  }
  for (int w : wanted) {
    if (w < 0 || w >= m) {
      return InvalidArgumentError("decoder: wanted block index " + std::to_string(w) +
                                  " out of range [0, " + std::to_string(m) + ")");
    }
  }
  // B = generator rows of the available blocks; B * data = available.
  std::vector<uint8_t> b(static_cast<size_t>(k_) * k_), binv(static_cast<size_t>(k_) * k_);
  for (int r = 0; r < k_; ++r) {
    std::memcpy(&b[static_cast<size_t>(r) * k_], &matrix_[static_cast<size_t>(available[r]) * k_],
                k_);
  }
  if (gf_invert_matrix(b.data(), binv.data(), k_) != 0) {
    return InternalError("decoder: generator sub-matrix is singular (code is not MDS)");
  }
  Decoder d;
  d.available_ = available;
  d.wanted_ = wanted;
  const int r = static_cast<int>(wanted.size());
  d.rows_.assign(static_cast<size_t>(r) * k_, 0);
  for (int i = 0; i < r; ++i) {
    // Row of the wanted block over the data, times B^-1: over the available.
    const uint8_t* g = &matrix_[static_cast<size_t>(wanted[i]) * k_];
    for (int c = 0; c < k_; ++c) {
      uint8_t acc = 0;
      for (int j = 0; j < k_; ++j) acc ^= gf_mul(g[j], binv[static_cast<size_t>(j) * k_ + c]);
      d.rows_[static_cast<size_t>(i) * k_ + c] = acc;
    }
  }
  d.xor_only_ =
      r > 0 && std::all_of(d.rows_.begin(), d.rows_.end(), [](uint8_t v) { return v == 1; });
  if (r > 0) {
    d.tables_.resize(static_cast<size_t>(32) * k_ * r);
    ec_init_tables(k_, r, d.rows_.data(), d.tables_.data());
  }
  return d;
}

void Decoder::Decode(size_t len, const uint8_t* const* in, uint8_t* const* out) const {
  if (len == 0 || wanted_.empty()) return;
  const int k = static_cast<int>(available_.size());
  if (xor_only_) {
    for (size_t i = 0; i < wanted_.size(); ++i) XorInto(len, in, k, out[i]);
    return;
  }
  ApplyTables(len, k, static_cast<int>(wanted_.size()), tables_, in, out);
}

}  // namespace memento::codec
