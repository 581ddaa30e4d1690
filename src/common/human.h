// Human-readable quantities for messages and reports ("1.50 GiB").
#pragma once

#include <cstdint>
#include <string>

namespace memento {

// Binary units: "0 B", "512 B", "1.50 KiB", "64.00 MiB", "3.20 GiB", "1.00 TiB".
[[nodiscard]] std::string HumanBytes(uint64_t bytes);
[[nodiscard]] std::string HumanBytes(double bytes);

}  // namespace memento
