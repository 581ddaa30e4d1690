// A slow, portable erasure codec used only by tests to check the ISA-L path:
// its own GF(2^8) arithmetic (polynomial 0x11d, as ISA-L), its own Cauchy
// matrix construction and its own Gauss-Jordan inversion. Never link it into
// production code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace memento::codec::reference {

uint8_t GfMul(uint8_t a, uint8_t b);
uint8_t GfInv(uint8_t a);  // REQUIRES: a != 0

// (k + f) x k row-major generator: identity, then all-ones (xor) or
// 1 / (i ^ j) for i in [k, k + f), j in [0, k) (Cauchy, as gf_gen_cauchy1_matrix).
std::vector<uint8_t> GeneratorMatrix(bool xor_code, int k, int f);

// Byte-at-a-time encode.
void Encode(const std::vector<uint8_t>& matrix, int k, int f, size_t len,
            const uint8_t* const* data, uint8_t* const* parity);

// Rebuilds all k data blocks from the k blocks `available` (indices into the
// k + f blocks) by solving the linear system; nullopt when singular.
std::optional<std::vector<std::vector<uint8_t>>> DecodeData(const std::vector<uint8_t>& matrix,
                                                            int k,
                                                            const std::vector<int>& available,
                                                            size_t len, const uint8_t* const* in);

// Rank of an r x c matrix over GF(2^8) (row-major).
int Rank(std::vector<uint8_t> m, int rows, int cols);

}  // namespace memento::codec::reference
