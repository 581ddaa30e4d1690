// A parity the client's copy workers compute from registered memory
// (docs/reft.md section 4): block `index` of a stripe's erasure code over k
// data blocks, each a list of runs of registered tensors, zero-padded to the
// block size. The snapshot writes it as a parity entry of its slot
// (shm::SlotEntrySpec::parity) chunk by chunk: the code is byte-wise, so each
// chunk [offset, offset + length) is encoded from the same bytes of every data
// block (codec::EncodeStream, the encoder the agent uses too).
//
// Thread safety: immutable after Create; Produce may run on many threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "codec/erasure_code.h"
#include "memento/status.h"
#include "shm/agent_messages.h"
#include "snap/copy_engine.h"

namespace memento::client {

class ParityProducer final : public snap::ChunkProducer {
 public:
  // Where bytes [offset, offset + length) of a registered tensor lie in
  // memory; InvalidArgument when the tensor is unknown, not in host memory,
  // or shorter.
  using Resolve = std::function<Result<const uint8_t*>(const shm::SaveRange&)>;

  // InvalidArgument naming the parity for a code the codec refuses, or a
  // range `resolve` refuses.
  [[nodiscard]] static Result<std::unique_ptr<ParityProducer>> Create(const shm::PlanParity& parity,
                                                                      const Resolve& resolve);

  uint32_t id() const { return id_; }
  uint64_t bytes() const { return block_bytes_; }

  Status Produce(uint64_t offset, size_t length, uint8_t* dst) const override;

 private:
  struct Run {
    const uint8_t* src = nullptr;
    uint64_t at = 0;  // offset in the block
    uint64_t length = 0;
  };
  ParityProducer(codec::ErasureCode code, uint32_t id, int index, uint64_t block_bytes)
      : code_(std::move(code)), id_(id), index_(index), block_bytes_(block_bytes) {}

  const codec::ErasureCode code_;
  const uint32_t id_;
  const int index_;
  const uint64_t block_bytes_;
  std::vector<std::vector<Run>> blocks_;  // k, runs in block order, contiguous from 0
  std::vector<uint64_t> filled_;          // per block: bytes before the zero padding
};

}  // namespace memento::client
