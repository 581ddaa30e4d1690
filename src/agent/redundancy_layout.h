// Access to the header and entry table of a redundancy version file
// (shm/redundancy_format.h) and the words the store's messages use. Internal
// to the shared-memory redundancy store (redundancy*.cc).
#pragma once

#include <string>

#include "fmt/format.h"
#include "recover/source.h"
#include "shm/redundancy_format.h"
#include "shm/segment.h"

namespace memento::agent {

inline shm::RedundancyHeader* HeaderOf(const shm::Segment& s) {
  return reinterpret_cast<shm::RedundancyHeader*>(s.data());
}

inline shm::RedundancyEntry* TableOf(const shm::Segment& s) {
  return reinterpret_cast<shm::RedundancyEntry*>(s.data() + HeaderOf(s)->table_offset);
}

// "copy 3", "parity 0".
inline std::string DescribeSource(recover::ByteSource e) {
  return fmt::format("{} {}", recover::SourceKindName(e.kind), e.id);
}

}  // namespace memento::agent
