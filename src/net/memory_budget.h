// MemoryBudget: a cap on the bytes that the connections of one server may
// hold at once (received request payloads), shared by all of them. Each
// connection's own cap is its largest frame (ConnectionOptions::max_payload,
// one request at a time); this bounds what N connections hold together, so
// that peers that announce large frames and stall cannot pin N times that
// (issue 21, section 4; docs/transport.md, "Memory caps").
//
//   MEMENTO_ASSIGN_OR_RETURN(MemoryBudget::Hold hold, budget.Reserve(len));
//   ... receive into memory of len bytes; `hold` gives it back when it ends.
//
// Thread safety: all methods may be called from any thread. A Hold may
// outlive nothing: its budget must outlive it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "memento/status.h"

namespace memento::net {

class MemoryBudget {
 public:
  // `limit` bytes in all; `name` says in refusals what sets the limit
  // (e.g. "--peer-max-buffered").
  MemoryBudget(uint64_t limit, std::string name) : limit_(limit), name_(std::move(name)) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Bytes reserved from a budget; given back when destroyed. Movable.
  class Hold {
   public:
    Hold() = default;
    ~Hold() { Release(); }
    Hold(Hold&& o) noexcept : budget_(o.budget_), bytes_(o.bytes_) { o.budget_ = nullptr; }
    Hold& operator=(Hold&& o) noexcept {
      if (this != &o) {
        Release();
        budget_ = o.budget_;
        bytes_ = o.bytes_;
        o.budget_ = nullptr;
      }
      return *this;
    }
    uint64_t bytes() const { return budget_ ? bytes_ : 0; }
    void Release();

   private:
    friend class MemoryBudget;
    Hold(MemoryBudget* b, uint64_t bytes) : budget_(b), bytes_(bytes) {}
    MemoryBudget* budget_ = nullptr;
    uint64_t bytes_ = 0;
  };

  // Reserves `bytes`, or ResourceExhausted naming the request, what is held
  // already, the limit and its name when they do not fit.
  [[nodiscard]] Result<Hold> Reserve(uint64_t bytes);

  uint64_t limit() const { return limit_; }
  uint64_t in_use() const { return in_use_.load(); }
  // The most ever held at once, and how many reservations were refused.
  uint64_t peak() const { return peak_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  const uint64_t limit_;
  const std::string name_;
  std::atomic<uint64_t> in_use_{0};
  std::atomic<uint64_t> peak_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace memento::net
