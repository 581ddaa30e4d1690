#include "net/memory_budget.h"

#include <fmt/format.h>

#include "common/human.h"

namespace memento::net {

void MemoryBudget::Hold::Release() {
  if (budget_ != nullptr) budget_->in_use_.fetch_sub(bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

Result<MemoryBudget::Hold> MemoryBudget::Reserve(uint64_t bytes) {
  uint64_t cur = in_use_.load();
  for (;;) {
    if (bytes > limit_ || cur > limit_ - bytes) {
      refused_.fetch_add(1);
      return ResourceExhaustedError(fmt::format(
          "{} bytes ({}) more would exceed the {}-byte ({}) limit on what all connections may hold "
          "at once ({} held now; {})",
          bytes, HumanBytes(bytes), limit_, HumanBytes(limit_), cur, name_));
    }
    if (in_use_.compare_exchange_weak(cur, cur + bytes)) break;
  }
  uint64_t now = cur + bytes;
  uint64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  return Hold(this, bytes);
}

}  // namespace memento::net
