#include "codec/erasure_code.h"

#include <gtest/gtest.h>
#include <isa-l/erasure_code.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "codec/reference_codec.h"
#include "common/test_util.h"

namespace memento::codec {
namespace {

// A buffer of `len` bytes that ends exactly at a PROT_NONE page, so any read or
// write past the end faults (ISA-L's own tests do the same).
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t len) : len_(len) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t body = (len + page - 1) / page * page;
    map_len_ = body + page;
    void* p = mmap(nullptr, map_len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    map_ = static_cast<uint8_t*>(p);
    if (mprotect(map_ + body, page, PROT_NONE) != 0) std::abort();
    data_ = map_ + body - len;
  }
  ~GuardedBuffer() { munmap(map_, map_len_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  uint8_t* data() { return data_; }
  size_t size() const { return len_; }

 private:
  size_t len_;
  size_t map_len_;
  uint8_t* map_;
  uint8_t* data_;
};

TEST(ErasureCodeTest, MatrixMatchesReference) {
  for (int k = 1; k <= 24; ++k) {
    for (int f = 1; f <= 4; ++f) {
      auto rs = ErasureCode::Create(CodeKind::kRs, k, f);
      ASSERT_TRUE(rs.ok()) << rs.status();
      EXPECT_EQ(rs->matrix(), reference::GeneratorMatrix(false, k, f)) << k << " " << f;
    }
    auto x = ErasureCode::Create(CodeKind::kXor, k, 1);
    ASSERT_TRUE(x.ok());
    EXPECT_EQ(x->matrix(), reference::GeneratorMatrix(true, k, 1));
  }
}

TEST(ErasureCodeTest, RejectsBadParameters) {
  EXPECT_EQ(ErasureCode::Create(CodeKind::kRs, 0, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErasureCode::Create(CodeKind::kRs, 4, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErasureCode::Create(CodeKind::kXor, 4, 2).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ErasureCode::Create(CodeKind::kRs, 250, 6).status().code(),
            StatusCode::kInvalidArgument);
  auto code = ErasureCode::Create(CodeKind::kRs, 3, 2);
  ASSERT_TRUE(code.ok());
  EXPECT_FALSE(code->MakeDecoder({0, 1}, {2}).ok());     // too few
  EXPECT_FALSE(code->MakeDecoder({0, 1, 1}, {2}).ok());  // repeated
  EXPECT_FALSE(code->MakeDecoder({0, 1, 5}, {2}).ok());  // out of range
  EXPECT_FALSE(code->MakeDecoder({0, 1, 3}, {7}).ok());  // wanted out of range
  EXPECT_TRUE(code->MakeDecoder({0, 3, 4}, {1, 2}).ok());
}

// Random k, f, lengths (so random start alignments: every buffer ends at a
// guard page), random erasure sets: the ISA-L path must produce the reference
// parity and rebuild the erased blocks exactly.
TEST(ErasureCodeTest, RandomRoundTripsAgainstReference) {
  const uint64_t seed = testing::TestSeed("RandomRoundTripsAgainstReference");
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 300; ++iter) {
    const bool use_xor = rng() % 3 == 0;
    const int k = 1 + static_cast<int>(rng() % 16);
    const int f = use_xor ? 1 : 1 + static_cast<int>(rng() % 4);
    size_t len = rng() % 3000;
    if (rng() % 2) len = len / 64 * 64;  // exercise the aligned xor_gen path too
    SCOPED_TRACE(::testing::Message() << "seed=" << seed << " iter=" << iter << " k=" << k
                                      << " f=" << f << " len=" << len << " xor=" << use_xor);
    auto code = ErasureCode::Create(use_xor ? CodeKind::kXor : CodeKind::kRs, k, f);
    ASSERT_TRUE(code.ok()) << code.status();
    std::vector<std::unique_ptr<GuardedBuffer>> blocks;
    std::vector<uint8_t*> ptr;
    for (int i = 0; i < k + f; ++i) {
      blocks.push_back(std::make_unique<GuardedBuffer>(len));
      ptr.push_back(blocks.back()->data());
    }
    for (int i = 0; i < k; ++i) {
      for (size_t b = 0; b < len; ++b) ptr[i][b] = static_cast<uint8_t>(rng());
    }
    code->Encode(len, ptr.data(), ptr.data() + k);
    std::vector<std::vector<uint8_t>> ref_parity(f, std::vector<uint8_t>(len));
    std::vector<uint8_t*> ref_ptr;
    for (auto& p : ref_parity) ref_ptr.push_back(p.data());
    reference::Encode(code->matrix(), k, f, len, ptr.data(), ref_ptr.data());
    for (int j = 0; j < f; ++j) {
      ASSERT_EQ(0, len ? std::memcmp(ptr[k + j], ref_parity[j].data(), len) : 0) << "parity " << j;
    }
    // Erase up to f blocks, decode them (data or parity) from k survivors.
    std::vector<int> order(k + f);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const int erased = static_cast<int>(rng() % (f + 1));
    std::vector<int> wanted(order.begin(), order.begin() + erased);
    std::vector<int> available(order.begin() + erased, order.begin() + erased + k);
    auto dec = code->MakeDecoder(available, wanted);
    ASSERT_TRUE(dec.ok()) << dec.status();
    std::vector<const uint8_t*> in;
    for (int a : available) in.push_back(ptr[a]);
    std::vector<std::unique_ptr<GuardedBuffer>> outs;
    std::vector<uint8_t*> out;
    for (size_t i = 0; i < wanted.size(); ++i) {
      outs.push_back(std::make_unique<GuardedBuffer>(len));
      out.push_back(outs.back()->data());
    }
    dec->Decode(len, in.data(), out.data());
    for (size_t i = 0; i < wanted.size(); ++i) {
      ASSERT_EQ(0, len ? std::memcmp(out[i], ptr[wanted[i]], len) : 0) << "block " << wanted[i];
    }
    // The reference solver agrees on the data blocks.
    auto ref = reference::DecodeData(code->matrix(), k, available, len, in.data());
    ASSERT_TRUE(ref.has_value());
    for (int i = 0; i < k; ++i) {
      ASSERT_EQ(0, len ? std::memcmp(ref->at(i).data(), ptr[i], len) : 0);
    }
  }
}

TEST(ErasureCodeTest, ChunkedEncodeAndDecodeMatchOneShot) {
  const uint64_t seed = testing::TestSeed("ChunkedEncodeAndDecodeMatchOneShot");
  std::mt19937_64 rng(seed);
  const int k = 5, f = 3;
  const size_t len = 100003;
  auto code = ErasureCode::Create(CodeKind::kRs, k, f);
  ASSERT_TRUE(code.ok());
  std::vector<std::vector<uint8_t>> data(k, std::vector<uint8_t>(len));
  for (auto& d : data) {
    for (auto& b : d) b = static_cast<uint8_t>(rng());
  }
  std::vector<const uint8_t*> dp;
  for (auto& d : data) dp.push_back(d.data());
  std::vector<std::vector<uint8_t>> whole(f, std::vector<uint8_t>(len));
  std::vector<uint8_t*> wp;
  for (auto& p : whole) wp.push_back(p.data());
  code->Encode(len, dp.data(), wp.data());

  std::vector<std::vector<uint8_t>> streamed(f, std::vector<uint8_t>(len));
  const size_t chunk = 4099;  // odd on purpose
  Status st = EncodeStream(
      *code, len, chunk,
      [&](size_t off, size_t n, uint8_t* const* bufs) {
        for (int i = 0; i < k; ++i) std::memcpy(bufs[i], data[i].data() + off, n);
        return Status::Ok();
      },
      [&](size_t off, size_t n, const uint8_t* const* par) {
        for (int j = 0; j < f; ++j) std::memcpy(streamed[j].data() + off, par[j], n);
        return Status::Ok();
      });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(whole, streamed);

  // Decode data blocks 1 and 3 plus parity 0 chunk by chunk from the rest.
  auto dec = code->MakeDecoder({0, 2, 4, 6, 7}, {1, 3, 5});
  ASSERT_TRUE(dec.ok()) << dec.status();
  std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(len));
  for (size_t off = 0; off < len; off += chunk) {
    const size_t n = std::min(chunk, len - off);
    const uint8_t* in[5] = {data[0].data() + off, data[2].data() + off, data[4].data() + off,
                            whole[1].data() + off, whole[2].data() + off};
    uint8_t* o[3] = {out[0].data() + off, out[1].data() + off, out[2].data() + off};
    dec->Decode(n, in, o);
  }
  EXPECT_EQ(out[0], data[1]);
  EXPECT_EQ(out[1], data[3]);
  EXPECT_EQ(out[2], whole[0]);

  // The same through DecodeStream.
  std::vector<std::vector<uint8_t>> out2(3, std::vector<uint8_t>(len));
  const std::vector<const std::vector<uint8_t>*> srcs = {&data[0], &data[2], &data[4], &whole[1],
                                                         &whole[2]};
  Status ds = DecodeStream(
      *dec, len, 777,
      [&](size_t off, size_t n, uint8_t* const* bufs) {
        for (int i = 0; i < 5; ++i) std::memcpy(bufs[i], srcs[i]->data() + off, n);
        return Status::Ok();
      },
      [&](size_t off, size_t n, const uint8_t* const* o) {
        for (int i = 0; i < 3; ++i) std::memcpy(out2[i].data() + off, o[i], n);
        return Status::Ok();
      });
  ASSERT_TRUE(ds.ok()) << ds;
  EXPECT_EQ(out2, out);

  // A failing sink stops the stream with its status.
  Status bad = EncodeStream(
      *code, len, chunk, [](size_t, size_t, uint8_t* const*) { return Status::Ok(); },
      [](size_t, size_t, const uint8_t* const*) { return DataLossError("sink failed"); });
  EXPECT_EQ(bad.code(), StatusCode::kDataLoss);
}

TEST(ErasureCodeTest, EveryErasurePatternDecodes) {
  // Exhaustive over all erasure sets of size <= f for a few small codes.
  const uint64_t seed = testing::TestSeed("EveryErasurePatternDecodes");
  std::mt19937_64 rng(seed);
  for (auto [k, f] : std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {3, 3}, {6, 2}, {4, 4}}) {
    auto code = ErasureCode::Create(CodeKind::kRs, k, f);
    ASSERT_TRUE(code.ok());
    const size_t len = 129;
    std::vector<std::vector<uint8_t>> blk(k + f, std::vector<uint8_t>(len));
    for (int i = 0; i < k; ++i) {
      for (auto& b : blk[i]) b = static_cast<uint8_t>(rng());
    }
    std::vector<const uint8_t*> dp;
    std::vector<uint8_t*> pp;
    for (int i = 0; i < k; ++i) dp.push_back(blk[i].data());
    for (int j = 0; j < f; ++j) pp.push_back(blk[k + j].data());
    code->Encode(len, dp.data(), pp.data());
    const int m = k + f;
    for (uint32_t mask = 0; mask < (1u << m); ++mask) {
      if (__builtin_popcount(mask) > f) continue;
      std::vector<int> wanted, available;
      for (int i = 0; i < m; ++i) (mask >> i & 1 ? wanted : available).push_back(i);
      available.resize(k);
      auto dec = code->MakeDecoder(available, wanted);
      ASSERT_TRUE(dec.ok()) << dec.status();
      std::vector<const uint8_t*> in;
      for (int a : available) in.push_back(blk[a].data());
      std::vector<std::vector<uint8_t>> out(wanted.size(), std::vector<uint8_t>(len));
      std::vector<uint8_t*> op;
      for (auto& o : out) op.push_back(o.data());
      dec->Decode(len, in.data(), op.data());
      for (size_t i = 0; i < wanted.size(); ++i) {
        ASSERT_EQ(out[i], blk[wanted[i]]) << "k=" << k << " f=" << f << " mask=" << mask;
      }
    }
  }
}

TEST(ErasureCodeTest, XorIntoMatchesPortableAtEveryAlignment) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> a(1200), b(1200), c(1200), out(1200), want(1200);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<uint8_t>(rng());
    b[i] = static_cast<uint8_t>(rng());
    c[i] = static_cast<uint8_t>(rng());
  }
  for (size_t shift = 0; shift < 64; shift += 7) {
    for (size_t len : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{1000}}) {
      const uint8_t* src[3] = {a.data() + shift, b.data() + shift, c.data() + shift};
      XorInto(len, src, 3, out.data() + shift);
      for (size_t i = 0; i < len; ++i) {
        ASSERT_EQ(out[shift + i], a[shift + i] ^ b[shift + i] ^ c[shift + i]);
      }
    }
  }
}

}  // namespace
}  // namespace memento::codec
