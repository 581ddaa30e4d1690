// Little-endian encoding of RPC messages. WireWriter appends; WireReader reads
// with bounds checks and turns any overrun into a Status (a malformed message
// from the network is bad input, never a crash).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "memento/status.h"

namespace memento::net {

class WireWriter {
 public:
  WireWriter& U8(uint8_t v) { return Raw(&v, 1); }
  WireWriter& U32(uint32_t v) { return Raw(&v, 4); }
  WireWriter& U64(uint64_t v) { return Raw(&v, 8); }
  WireWriter& I64(int64_t v) { return Raw(&v, 8); }
  WireWriter& F64(double v) { return Raw(&v, 8); }
  // Length-prefixed (u32) bytes.
  WireWriter& Bytes(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    return Raw(s.data(), s.size());
  }
  WireWriter& Raw(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string& str() { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class WireReader {
 public:
  explicit WireReader(std::string_view in) : in_(in) {}

  [[nodiscard]] Status U8(uint8_t* v) { return Raw(v, 1); }
  [[nodiscard]] Status U32(uint32_t* v) { return Raw(v, 4); }
  [[nodiscard]] Status U64(uint64_t* v) { return Raw(v, 8); }
  [[nodiscard]] Status I64(int64_t* v) { return Raw(v, 8); }
  [[nodiscard]] Status F64(double* v) { return Raw(v, 8); }
  [[nodiscard]] Status Bytes(std::string* s) {
    uint32_t n = 0;
    MEMENTO_RETURN_IF_ERROR(U32(&n));
    if (n > in_.size() - pos_) return Overrun(n);
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  [[nodiscard]] Status Raw(void* p, size_t n) {
    if (n > in_.size() - pos_) return Overrun(n);
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  // InvalidArgument unless every byte was consumed.
  [[nodiscard]] Status Done() const {
    if (pos_ != in_.size()) {
      return InvalidArgumentError(fmt::format("message has {} trailing bytes", in_.size() - pos_));
    }
    return Status::Ok();
  }
  std::string_view rest() const { return in_.substr(pos_); }

 private:
  Status Overrun(size_t n) const {
    return InvalidArgumentError(fmt::format(
        "message truncated: need {} bytes at offset {}, {} left", n, pos_, in_.size() - pos_));
  }
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace memento::net
