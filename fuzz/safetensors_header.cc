// Fuzz target: the safetensors header of a durable data file
// (tier::ReadSafetensorsHeader), the input being the whole file: length
// prefix, JSON header, data. No input may crash, hang or make the reader
// allocate what the file does not hold.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "memento/types.h"
#include "tier/env.h"
#include "tier/safetensors.h"

namespace {

class MemoryFile : public memento::tier::RandomAccessFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  memento::Result<size_t> Read(uint64_t offset, void* buf, size_t len) override {
    if (offset >= size_) return size_t{0};
    const size_t n = std::min<uint64_t>(len, size_ - offset);
    std::memcpy(buf, data_ + offset, n);
    return n;
  }
  memento::Result<uint64_t> Size() override { return uint64_t{size_}; }
  bool direct() const override { return false; }

 private:
  const uint8_t* data_;
  size_t size_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemoryFile file(data, size);
  auto h = memento::tier::ReadSafetensorsHeader(&file, size, "fuzz.safetensors");
  if (h.ok()) {
    // A header that validated describes only bytes the file holds.
    // Its shape and dtype account for exactly the bytes of its range (no
    // element count that wrapped around).
    for (const auto& e : h->entries) {
      if (e.begin > e.end || h->data_start + e.end > size) __builtin_trap();
      auto dt = memento::ParseDType(e.dtype);
      if (!dt.ok()) __builtin_trap();
      unsigned __int128 bytes = memento::DTypeSize(*dt);
      for (int64_t d : e.shape) {
        bytes *= static_cast<uint64_t>(d);
        if (bytes > (static_cast<unsigned __int128>(1) << 64)) __builtin_trap();
      }
      if (bytes != e.end - e.begin) __builtin_trap();
    }
  }
  return 0;
}
