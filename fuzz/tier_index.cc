// Fuzz target: the durable tier's text formats, as read back from disk
// (src/tier/format.h): a version's index.json and a node's manifest
// node-N.json (ParseIndex), a node's marker node-N.done (ParseNodeMarker) and
// the COMMIT record (ParseCommit). The first byte picks the parser. Whatever
// parses is used the way the readers use it (names looked up, parts merged,
// sizes summed): no input may crash, hang or allocate without bound.
#include <cstdint>
#include <string>

#include "tier/format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memento::tier;
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      auto index = ParseIndex(text, "fuzz/index.json");
      if (!index.ok()) return 0;
      (void)index->stored_bytes();
      for (const auto& [name, t] : index->tensors) {
        (void)RankTensorName(*index, 0, name);
        (void)RankTensorName(*index, 3, name);
      }
      VersionIndex merged;
      (void)MergeIndex(*index, &merged);
      (void)MergeIndex(*index, &merged);  // the same parts twice
      auto again = ParseIndex(SerializeIndex(*index), "fuzz/reserialized");
      (void)again;
      break;
    }
    case 1: {
      auto m = ParseNodeMarker(text, "fuzz/node-00000.done");
      if (m.ok()) (void)ParseNodeMarker(SerializeNodeMarker(*m), "fuzz/reserialized");
      break;
    }
    default: {
      auto c = ParseCommit(text, "fuzz/COMMIT");
      if (c.ok()) (void)ParseCommit(SerializeCommit(*c), "fuzz/reserialized");
      break;
    }
  }
  return 0;
}
