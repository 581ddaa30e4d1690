#include "codec/reference_codec.h"

#include <cstring>

namespace memento::codec::reference {

uint8_t GfMul(uint8_t a, uint8_t b) {
  // Russian-peasant multiplication modulo x^8 + x^4 + x^3 + x^2 + 1 (0x11d).
  uint8_t p = 0;
  while (b) {
    if (b & 1) p ^= a;
    const bool carry = a & 0x80;
    a = static_cast<uint8_t>(a << 1);
    if (carry) a ^= 0x1d;
    b >>= 1;
  }
  return p;
}

uint8_t GfInv(uint8_t a) {
  for (int x = 1; x < 256; ++x) {
    if (GfMul(a, static_cast<uint8_t>(x)) == 1) return static_cast<uint8_t>(x);
  }
  return 0;
}

std::vector<uint8_t> GeneratorMatrix(bool xor_code, int k, int f) {
  std::vector<uint8_t> m(static_cast<size_t>(k + f) * k, 0);
  for (int i = 0; i < k; ++i) m[static_cast<size_t>(i) * k + i] = 1;
  for (int i = k; i < k + f; ++i) {
    for (int j = 0; j < k; ++j) {
      m[static_cast<size_t>(i) * k + j] = xor_code ? 1 : GfInv(static_cast<uint8_t>(i ^ j));
    }
  }
  return m;
}

void Encode(const std::vector<uint8_t>& matrix, int k, int f, size_t len,
            const uint8_t* const* data, uint8_t* const* parity) {
  for (int j = 0; j < f; ++j) {
    const uint8_t* row = &matrix[static_cast<size_t>(k + j) * k];
    for (size_t b = 0; b < len; ++b) {
      uint8_t acc = 0;
      for (int i = 0; i < k; ++i) acc ^= GfMul(row[i], data[i][b]);
      parity[j][b] = acc;
    }
  }
}

namespace {
// Inverts an n x n matrix in place by Gauss-Jordan; false when singular.
bool Invert(std::vector<uint8_t>& a, int n, std::vector<uint8_t>& inv) {
  inv.assign(static_cast<size_t>(n) * n, 0);
  for (int i = 0; i < n; ++i) inv[static_cast<size_t>(i) * n + i] = 1;
  for (int col = 0; col < n; ++col) {
    int pivot = -1;
    for (int r = col; r < n; ++r) {
      if (a[static_cast<size_t>(r) * n + col]) {
        pivot = r;
        break;
      }
    }
    if (pivot < 0) return false;
    for (int c = 0; c < n; ++c) {
      std::swap(a[static_cast<size_t>(col) * n + c], a[static_cast<size_t>(pivot) * n + c]);
      std::swap(inv[static_cast<size_t>(col) * n + c], inv[static_cast<size_t>(pivot) * n + c]);
    }
    const uint8_t s = GfInv(a[static_cast<size_t>(col) * n + col]);
    for (int c = 0; c < n; ++c) {
      a[static_cast<size_t>(col) * n + c] = GfMul(a[static_cast<size_t>(col) * n + c], s);
      inv[static_cast<size_t>(col) * n + c] = GfMul(inv[static_cast<size_t>(col) * n + c], s);
    }
    for (int r = 0; r < n; ++r) {
      const uint8_t fct = a[static_cast<size_t>(r) * n + col];
      if (r == col || fct == 0) continue;
      for (int c = 0; c < n; ++c) {
        a[static_cast<size_t>(r) * n + c] ^= GfMul(fct, a[static_cast<size_t>(col) * n + c]);
        inv[static_cast<size_t>(r) * n + c] ^= GfMul(fct, inv[static_cast<size_t>(col) * n + c]);
      }
    }
  }
  return true;
}
}  // namespace

std::optional<std::vector<std::vector<uint8_t>>> DecodeData(const std::vector<uint8_t>& matrix,
                                                            int k,
                                                            const std::vector<int>& available,
                                                            size_t len, const uint8_t* const* in) {
  std::vector<uint8_t> b(static_cast<size_t>(k) * k), inv;
  for (int r = 0; r < k; ++r) {
    std::memcpy(&b[static_cast<size_t>(r) * k], &matrix[static_cast<size_t>(available[r]) * k], k);
  }
  if (!Invert(b, k, inv)) return std::nullopt;
  std::vector<std::vector<uint8_t>> out(k, std::vector<uint8_t>(len));
  for (int i = 0; i < k; ++i) {
    for (size_t x = 0; x < len; ++x) {
      uint8_t acc = 0;
      for (int j = 0; j < k; ++j) acc ^= GfMul(inv[static_cast<size_t>(i) * k + j], in[j][x]);
      out[i][x] = acc;
    }
  }
  return out;
}

int Rank(std::vector<uint8_t> m, int rows, int cols) {
  int rank = 0;
  for (int col = 0; col < cols && rank < rows; ++col) {
    int pivot = -1;
    for (int r = rank; r < rows; ++r) {
      if (m[static_cast<size_t>(r) * cols + col]) {
        pivot = r;
        break;
      }
    }
    if (pivot < 0) continue;
    for (int c = 0; c < cols; ++c) {
      std::swap(m[static_cast<size_t>(rank) * cols + c], m[static_cast<size_t>(pivot) * cols + c]);
    }
    const uint8_t s = GfInv(m[static_cast<size_t>(rank) * cols + col]);
    for (int r = 0; r < rows; ++r) {
      if (r == rank) continue;
      const uint8_t fct = GfMul(m[static_cast<size_t>(r) * cols + col], s);
      if (!fct) continue;
      for (int c = 0; c < cols; ++c) {
        m[static_cast<size_t>(r) * cols + c] ^= GfMul(fct, m[static_cast<size_t>(rank) * cols + c]);
      }
    }
    ++rank;
  }
  return rank;
}

}  // namespace memento::codec::reference
