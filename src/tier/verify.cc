#include "tier/verify.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "common/checksum.h"
#include "tier/format.h"
#include "tier/reader.h"
#include "tier/safetensors.h"

namespace memento::tier {

bool VerifyReport::ok() const {
  for (const auto& v : versions) {
    if (!v.problems.empty()) return false;
  }
  return true;
}

namespace {

// Every node's manifest (node-N.json) against its marker and the version.
void CheckManifests(Env* env, const std::string& vdir, int64_t step, const VersionIndex& index,
                    std::vector<std::string>* problems) {
  for (const auto& n : index.nodes) {
    if (n.manifest.empty()) continue;  // written before manifests were recorded
    const std::string path = vdir + "/" + n.manifest;
    auto text = env->ReadFileToString(path);
    if (!text.ok()) {
      problems->push_back(fmt::format("{}: node {}'s manifest is missing or unreadable ({})", path,
                                      n.node, text.status().ToString()));
      continue;
    }
    const std::string marker_path = vdir + "/" + NodeMarkerName(n.node);
    if (env->FileExists(marker_path)) {
      auto marker_text = env->ReadFileToString(marker_path);
      auto marker = marker_text.ok() ? ParseNodeMarker(*marker_text, marker_path)
                                     : Result<NodeMarker>(marker_text.status());
      if (!marker.ok()) {
        problems->push_back(marker.status().ToString());
      } else {
        const uint64_t sum = Checksum(text->data(), text->size());
        if (marker->manifest_size != text->size() || marker->manifest_xxh3 != sum) {
          problems->push_back(fmt::format("{}: {} bytes xxh3 {}, {} says {} bytes xxh3 {}", path,
                                          text->size(), HexU64(sum), NodeMarkerName(n.node),
                                          marker->manifest_size, HexU64(marker->manifest_xxh3)));
          continue;
        }
      }
    }
    auto manifest = ParseIndex(*text, path);
    if (!manifest.ok()) {
      problems->push_back(manifest.status().ToString());
      continue;
    }
    if (manifest->step != step) {
      problems->push_back(
          fmt::format("{}: names step {}, expected {}", path, manifest->step, step));
    }
  }
}

// COMMIT and the index; nullopt (problems filled) when the version cannot be
// read any further.
std::optional<VersionIndex> CheckCommitAndIndex(Env* env, const std::string& root, int64_t step,
                                                VersionCheck* check) {
  const std::string vdir = root + "/" + VersionDirName(step);
  if (!env->IsDirectory(vdir)) {
    check->problems.push_back(fmt::format("{}: version {} was never written here", vdir, step));
    return std::nullopt;
  }
  if (!env->FileExists(vdir + "/" + kCommitFileName)) {
    check->problems.push_back(fmt::format(
        "{}: no COMMIT marker: version {} is incomplete and does not exist", vdir, step));
    return std::nullopt;
  }
  check->complete = true;
  auto index = LoadIndex(env, root, step);
  if (!index.ok()) {
    check->problems.push_back(index.status().ToString());
    return std::nullopt;
  }
  return std::move(*index);
}

}  // namespace

VersionCheck QuickCheckVersion(Env* env, const std::string& root, int64_t step) {
  VersionCheck check;
  check.step = step;
  auto index = CheckCommitAndIndex(env, root, step, &check);
  if (!index) return check;
  const std::string vdir = root + "/" + VersionDirName(step);
  CheckManifests(env, vdir, step, *index, &check.problems);
  for (const auto& n : index->nodes) {
    const std::string path = vdir + "/" + n.file;
    auto size = env->FileSize(path);
    if (!size.ok()) {
      check.problems.push_back(fmt::format("{}: missing ({})", path, size.status().ToString()));
    } else if (*size != n.file_size) {
      check.problems.push_back(fmt::format("{}: {} bytes, index says {} (truncated or extended)",
                                           path, *size, n.file_size));
    }
  }
  check.ok = check.problems.empty();
  return check;
}

VersionCheck VerifyVersion(Env* env, const std::string& root, int64_t step) {
  VersionCheck check;
  check.step = step;
  auto index = CheckCommitAndIndex(env, root, step, &check);
  if (!index) return check;
  const std::string vdir = root + "/" + VersionDirName(step);
  CheckManifests(env, vdir, step, *index, &check.problems);
  // COMMIT's file list against the index's nodes.
  auto commit_text = env->ReadFileToString(vdir + "/" + kCommitFileName);
  std::set<std::string> commit_files;
  if (commit_text.ok()) {
    auto commit = ParseCommit(*commit_text, vdir + "/" + kCommitFileName);
    if (commit.ok()) commit_files.insert(commit->files.begin(), commit->files.end());
  }
  if (static_cast<int>(index->nodes.size()) != index->num_nodes) {
    check.problems.push_back(fmt::format("{}/index.json: {} node files for num_nodes {}", vdir,
                                         index->nodes.size(), index->num_nodes));
  }
  // Per data file: size and safetensors header agreeing with the index.
  std::map<std::string, std::map<std::string, SafetensorsEntry>> headers;
  std::map<std::string, uint64_t> data_start;
  std::map<std::string, std::unique_ptr<RandomAccessFile>> files;
  for (const auto& n : index->nodes) {
    const std::string path = vdir + "/" + n.file;
    if (!commit_files.count(n.file)) {
      check.problems.push_back(fmt::format("{}: not listed in COMMIT", path));
    }
    auto size = env->FileSize(path);
    if (!size.ok()) {
      check.problems.push_back(fmt::format("{}: missing ({})", path, size.status().ToString()));
      continue;
    }
    if (*size != n.file_size) {
      check.problems.push_back(fmt::format("{}: {} bytes, index says {} (truncated or extended)",
                                           path, *size, n.file_size));
      continue;
    }
    auto file = env->NewRandomAccessFile(path, /*direct=*/true);
    if (!file.ok()) {
      check.problems.push_back(file.status().ToString());
      continue;
    }
    auto header = ReadSafetensorsHeader(file->get(), *size, path);
    if (!header.ok()) {
      check.problems.push_back(header.status().ToString());
      continue;
    }
    for (const auto& e : header->entries) headers[n.file][e.key] = e;
    data_start[n.file] = header->data_start;
    files[n.file] = std::move(*file);
  }
  // Every piece: present in its file's header at the same place, checksum.
  AlignedBuffer buffer(8 << 20);
  for (const auto& [name, t] : index->tensors) {
    for (const auto& p : t.pieces) {
      auto f = files.find(p.file);
      if (f == files.end()) {
        bool listed = false;
        for (const auto& n : index->nodes) listed |= n.file == p.file;
        if (!listed) {
          check.problems.push_back(
              fmt::format("{}/index.json: piece '{}' of tensor '{}' is in "
                          "{}, which no node wrote",
                          vdir, p.key, name, p.file));
        }
        continue;  // otherwise the file's own problem is already reported
      }
      const std::string path = vdir + "/" + p.file;
      auto h = headers[p.file].find(p.key);
      if (h == headers[p.file].end()) {
        check.problems.push_back(fmt::format(
            "{}: piece '{}' of tensor '{}' is not in the file header", path, p.key, name));
        continue;
      }
      if (data_start[p.file] + h->second.begin != p.file_offset ||
          h->second.end - h->second.begin != p.length) {
        check.problems.push_back(
            fmt::format("{}: piece '{}' is at bytes {}+{} in the header but {}+{} in the index",
                        path, p.key, data_start[p.file] + h->second.begin,
                        h->second.end - h->second.begin, p.file_offset, p.length));
        continue;
      }
      Status s = internal::ReadPiece(
          f->second.get(), p, &buffer, path, [](uint64_t, const uint8_t*, size_t) {},
          &check.bytes_checked);
      if (!s.ok()) check.problems.push_back(s.message());
    }
  }
  check.ok = check.problems.empty();
  return check;
}

Result<VerifyReport> Verify(Env* env, const std::string& root, std::optional<int64_t> step) {
  VerifyReport report;
  if (step) {
    report.versions.push_back(VerifyVersion(env, root, *step));
    return report;
  }
  if (!env->IsDirectory(root)) return NotFoundError(root + " is not a directory");
  MEMENTO_ASSIGN_OR_RETURN(auto versions, ListVersions(env, root));
  for (const auto& v : versions) {
    if (!v.complete) {
      VersionCheck c;
      c.step = v.step;
      if (env->FileExists(v.dir + "/" + kCommitFileName)) {
        c.complete = true;  // a COMMIT that does not parse is a problem
        c.problems.push_back(v.dir + ": " + v.state);
      }
      report.versions.push_back(std::move(c));
      continue;
    }
    report.versions.push_back(VerifyVersion(env, root, v.step));
  }
  return report;
}

}  // namespace memento::tier
