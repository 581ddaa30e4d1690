// Template bodies for erasure_code.h. Do not include directly.
#pragma once

#include <algorithm>
#include <memory>

namespace memento::codec {

template <typename Fill, typename Sink>
Status EncodeStream(const ErasureCode& code, size_t len, size_t chunk_bytes, Fill&& fill,
                    Sink&& sink) {
  if (chunk_bytes == 0) return InvalidArgumentError("EncodeStream: chunk_bytes must be > 0");
  const int k = code.k();
  const int f = code.f();
  chunk_bytes = std::min(chunk_bytes, std::max<size_t>(len, 1));
  // One allocation, 64-byte aligned chunks so ISA-L takes its fast paths.
  const size_t stride = (chunk_bytes + 63) / 64 * 64;
  std::unique_ptr<uint8_t[]> raw(new uint8_t[stride * (k + f) + 64]);
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw.get()) + 63) / 64 * 64);
  std::vector<uint8_t*> data(k), parity(f);
  for (int i = 0; i < k; ++i) data[i] = base + stride * i;
  for (int j = 0; j < f; ++j) parity[j] = base + stride * (k + j);
  for (size_t off = 0; off < len; off += chunk_bytes) {
    const size_t n = std::min(chunk_bytes, len - off);
    MEMENTO_RETURN_IF_ERROR(fill(off, n, data.data()));
    code.Encode(n, data.data(), parity.data());
    MEMENTO_RETURN_IF_ERROR(sink(off, n, const_cast<const uint8_t* const*>(parity.data())));
  }
  return Status::Ok();
}

template <typename Fill, typename Sink>
Status DecodeStream(const Decoder& decoder, size_t len, size_t chunk_bytes, Fill&& fill,
                    Sink&& sink) {
  if (chunk_bytes == 0) return InvalidArgumentError("DecodeStream: chunk_bytes must be > 0");
  const int k = static_cast<int>(decoder.available().size());
  const int r = static_cast<int>(decoder.wanted().size());
  chunk_bytes = std::min(chunk_bytes, std::max<size_t>(len, 1));
  const size_t stride = (chunk_bytes + 63) / 64 * 64;
  std::unique_ptr<uint8_t[]> raw(new uint8_t[stride * (k + r) + 64]);
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw.get()) + 63) / 64 * 64);
  std::vector<uint8_t*> in(k), out(r);
  for (int i = 0; i < k; ++i) in[i] = base + stride * i;
  for (int j = 0; j < r; ++j) out[j] = base + stride * (k + j);
  for (size_t off = 0; off < len; off += chunk_bytes) {
    const size_t n = std::min(chunk_bytes, len - off);
    MEMENTO_RETURN_IF_ERROR(fill(off, n, in.data()));
    decoder.Decode(n, const_cast<const uint8_t* const*>(in.data()), out.data());
    MEMENTO_RETURN_IF_ERROR(sink(off, n, const_cast<const uint8_t* const*>(out.data())));
  }
  return Status::Ok();
}

}  // namespace memento::codec
