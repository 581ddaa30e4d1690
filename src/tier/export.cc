#include "tier/export.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "tier/format.h"
#include "tier/reader.h"
#include "tier/safetensors.h"

namespace memento::tier {
namespace {

// "rank<digits>/<name>" -> name; anything else unchanged.
std::string LogicalName(const std::string& stored) {
  if (stored.rfind("rank", 0) != 0) return stored;
  size_t i = 4;
  while (i < stored.size() && stored[i] >= '0' && stored[i] <= '9') ++i;
  if (i == 4 || i >= stored.size() || stored[i] != '/') return stored;
  return stored.substr(i + 1);
}

Status WriteAll(int fd, const void* data, size_t len, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("write " + path, errno);
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Result<ExportReport> ExportSafetensors(Env* env, const std::string& root,
                                       std::optional<int64_t> step, const std::string& out_path,
                                       const ExportOptions& options) {
  if (options.rank < 0) return InvalidArgumentError("export: rank must be >= 0");
  int64_t s = 0;
  if (step) {
    s = *step;
  } else {
    MEMENTO_ASSIGN_OR_RETURN(s, LatestCompleteVersion(env, root));
  }
  MEMENTO_ASSIGN_OR_RETURN(VersionIndex index, LoadIndex(env, root, s));

  // The rank's logical names, each resolved to the stored tensor that holds it.
  std::set<std::string> logical;
  for (const auto& [name, rec] : index.tensors) logical.insert(LogicalName(name));
  struct Item {
    std::string out_name;
    TensorMeta meta;
    std::vector<int64_t> shape;
  };
  std::vector<Item> items;
  for (const std::string& name : logical) {
    bool excluded = false;
    for (const auto& p : options.exclude_prefixes) excluded |= name.rfind(p, 0) == 0;
    if (excluded || name.rfind(options.prefix, 0) != 0) continue;
    Result<std::string> stored = RankTensorName(index, options.rank, name);
    if (!stored.ok()) {
      if (stored.status().code() == StatusCode::kNotFound) continue;  // another rank's
      return stored.status();
    }
    const TensorRecord& rec = index.tensors.at(*stored);
    Item it;
    it.out_name = name.substr(options.prefix.size());
    it.meta.name = name;
    it.meta.dtype = rec.dtype;
    it.meta.shape = rec.shape;
    it.meta.state_class = rec.state_class;
    if (rec.global) {
      it.meta.global_numel = static_cast<int64_t>(rec.nbytes / DTypeSize(rec.dtype));
      it.meta.shard_offset = 0;
      it.meta.shape = {it.meta.global_numel};
    }
    it.shape = it.meta.shape;
    items.push_back(std::move(it));
  }
  if (items.empty()) {
    return NotFoundError("export: step " + std::to_string(s) + " in " + root +
                         " holds no tensor of rank " + std::to_string(options.rank) +
                         (options.prefix.empty() ? "" : " named '" + options.prefix + "...'"));
  }

  std::vector<SafetensorsEntry> entries;
  uint64_t offset = 0;
  for (const Item& it : items) {
    SafetensorsEntry e;
    e.key = it.out_name;
    e.dtype = std::string(DTypeName(it.meta.dtype));
    e.shape = it.shape;
    e.begin = offset;
    e.end = offset + it.meta.nbytes();
    offset = e.end;
    entries.push_back(std::move(e));
  }
  std::vector<uint8_t> data(offset);
  std::vector<RestoreTarget> targets;
  for (size_t i = 0; i < items.size(); ++i) {
    RestoreTarget t(items[i].meta, data.data() + entries[i].begin);
    t.rank = options.rank;
    targets.push_back(std::move(t));
  }
  RestoreOptions ro;
  ro.direct_io = false;
  ro.verify_before_write = false;
  MEMENTO_RETURN_IF_ERROR(Restore(env, root, s, targets, ro).status());

  std::map<std::string, std::string> metadata = {{"job", index.job},
                                                 {"step", std::to_string(s)},
                                                 {"rank", std::to_string(options.rank)},
                                                 {"format", "pt"}};
  std::string header = EncodeSafetensorsHeader(entries, metadata);
  std::string tmp = out_path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("export: create " + tmp, errno);
  Status st = WriteAll(fd, header.data(), header.size(), tmp);
  if (st.ok()) st = WriteAll(fd, data.data(), data.size(), tmp);
  if (st.ok() && ::fsync(fd) != 0) st = ErrnoError("fsync " + tmp, errno);
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), out_path.c_str()) != 0) {
    st = ErrnoError("rename " + tmp + " to " + out_path, errno);
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  ExportReport r;
  r.step = s;
  r.path = out_path;
  r.tensors = items.size();
  r.bytes = offset;
  return r;
}

}  // namespace memento::tier
