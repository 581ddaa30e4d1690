#include "client/parity_producer.h"

#include <algorithm>
#include <cstring>

#include "fmt/format.h"

namespace memento::client {

namespace {

// Scratch per data block of one EncodeStream call: small enough to stay in
// cache while the k blocks are encoded.
constexpr size_t kEncodeScratchBytes = size_t{256} << 10;

}  // namespace

Result<std::unique_ptr<ParityProducer>> ParityProducer::Create(const shm::PlanParity& parity,
                                                               const Resolve& resolve) {
  auto code = codec::ErasureCode::Create(
      parity.xor_code ? codec::CodeKind::kXor : codec::CodeKind::kRs, parity.k, parity.f);
  if (!code.ok()) {
    return InvalidArgumentError(fmt::format("parity {}: {}", parity.id, code.status().message()));
  }
  if (parity.index < 0 || parity.index >= parity.f ||
      parity.blocks.size() != static_cast<size_t>(parity.k)) {
    return InvalidArgumentError(fmt::format("parity {}: index {} of f = {}, {} blocks for k = {}",
                                            parity.id, parity.index, parity.f, parity.blocks.size(),
                                            parity.k));
  }
  std::unique_ptr<ParityProducer> p(
      new ParityProducer(std::move(*code), parity.id, parity.index, parity.block_bytes));
  for (size_t i = 0; i < parity.blocks.size(); ++i) {
    std::vector<Run> runs;
    uint64_t at = 0;
    for (const shm::SaveRange& r : parity.blocks[i]) {
      if (r.length == 0) continue;
      if (r.length > parity.block_bytes - at) {
        return InvalidArgumentError(fmt::format("parity {}: block {} is longer than {} bytes",
                                                parity.id, i, parity.block_bytes));
      }
      auto src = resolve(r);
      if (!src.ok()) {
        return InvalidArgumentError(
            fmt::format("parity {} block {}: {}", parity.id, i, src.status().message()));
      }
      runs.push_back(Run{*src, at, r.length});
      at += r.length;
    }
    p->blocks_.push_back(std::move(runs));
    p->filled_.push_back(at);
  }
  return p;
}

Status ParityProducer::Produce(uint64_t offset, size_t length, uint8_t* dst) const {
  if (offset > block_bytes_ || length > block_bytes_ - offset) {
    return InternalError(fmt::format("parity {}: bytes [{}, +{}) past its {} bytes", id_, offset,
                                     length, block_bytes_));
  }
  return codec::EncodeStream(
      code_, length, kEncodeScratchBytes,
      [&](size_t off, size_t n, uint8_t* const* chunks) -> Status {
        const uint64_t lo = offset + off, hi = lo + n;  // in the block
        for (size_t i = 0; i < blocks_.size(); ++i) {
          for (const Run& r : blocks_[i]) {
            if (r.at + r.length <= lo) continue;
            if (r.at >= hi) break;
            const uint64_t a = std::max(lo, r.at), b = std::min(hi, r.at + r.length);
            std::memcpy(chunks[i] + (a - lo), r.src + (a - r.at), b - a);
          }
          // The runs fill the block contiguously up to filled_[i]; zeros after.
          const uint64_t data_end = std::clamp(filled_[i], lo, hi);
          if (data_end < hi) std::memset(chunks[i] + (data_end - lo), 0, hi - data_end);
        }
        return Status::Ok();
      },
      [&](size_t off, size_t n, const uint8_t* const* parity) -> Status {
        std::memcpy(dst + off, parity[index_], n);
        return Status::Ok();
      });
}

}  // namespace memento::client
