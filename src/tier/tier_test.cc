// Durable tier: format, write/commit, restore (same topology and resharded),
// verify, retention and discovery.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "common/test_util.h"
#include "tier/discovery.h"
#include "tier/persister.h"
#include "tier/reader.h"
#include "tier/retention.h"
#include "tier/safetensors.h"
#include "tier/verify.h"
#include "tier/writer.h"

namespace memento::tier {
namespace {

// MEMENTO_DURABLE_IO=auto|uring|pwrite runs every test on that engine
// (docs/durable_tier.md); the library itself does not read the variable.
[[maybe_unused]] const bool kEngineFromEnvironment = [] {
  const char* name = std::getenv("MEMENTO_DURABLE_IO");
  if (name == nullptr || *name == '\0') return false;
  Result<IoEngine> engine = ParseIoEngine(name);
  if (!engine.ok()) {
    std::fprintf(stderr, "tier_test: %s\n", engine.status().ToString().c_str());
    std::abort();
  }
  Env::SetDefaultIoEngine(*engine);
  return true;
}();

using memento::testing::ScratchDir;

std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TensorMeta Meta(std::string name, DType dtype, std::vector<int64_t> shape,
                StateClass cls = StateClass::kReplicated, int64_t global_numel = 0,
                int64_t shard_offset = 0) {
  TensorMeta m;
  m.name = std::move(name);
  m.dtype = dtype;
  m.shape = std::move(shape);
  m.state_class = cls;
  m.global_numel = global_numel;
  m.shard_offset = shard_offset;
  return m;
}

// A job's full state: a replicated weight cut into per-node pieces (global
// parameter sharding), a ZeRO-1 optimizer tensor sharded over DP, and one
// private tensor per node.
struct JobState {
  std::vector<uint8_t> weight;            // "w": F32 [64, 33]
  std::vector<uint8_t> bias;              // "b": BF16 [7] (odd size, pieces not element-aligned)
  std::vector<uint8_t> optim;             // "exp_avg": F32 global_numel 1001
  std::vector<std::vector<uint8_t>> rng;  // "rank<i>/rng": U8 [16]
};

JobState MakeState(uint64_t seed, int nodes) {
  std::mt19937_64 rng(seed);
  JobState s;
  s.weight = RandomBytes(rng, 64 * 33 * 4);
  s.bias = RandomBytes(rng, 7 * 2);
  s.optim = RandomBytes(rng, 1001 * 4);
  for (int i = 0; i < nodes; ++i) s.rng.push_back(RandomBytes(rng, 16));
  return s;
}

// Element range [begin, end) of DP rank r out of d for n elements.
std::pair<int64_t, int64_t> ShardRange(int64_t n, int r, int d) {
  int64_t per = (n + d - 1) / d;
  int64_t b = std::min(n, per * r);
  return {b, std::min(n, b + per)};
}

VersionView NodeView(const JobState& s, int64_t step, int node, int nodes) {
  VersionView v;
  v.job = "job-test";
  v.node = node;
  v.num_nodes = nodes;
  v.step = step;
  v.topology_json = R"({"dp": )" + std::to_string(nodes) + "}";
  // Replicated weight: node i stores byte piece i of n (byte-cut, not element-aligned).
  auto piece = [&](const std::vector<uint8_t>& bytes, TensorMeta meta) {
    uint64_t per = (bytes.size() + nodes - 1) / nodes;
    uint64_t b = std::min<uint64_t>(bytes.size(), per * node);
    uint64_t e = std::min<uint64_t>(bytes.size(), b + per);
    if (e > b) v.entries.push_back(ViewEntry{meta, b, e - b, bytes.data() + b});
  };
  piece(s.weight, Meta("w", DType::kFloat32, {64, 33}));
  piece(s.bias, Meta("b", DType::kBFloat16, {7}));
  auto [ob, oe] = ShardRange(1001, node, nodes);
  v.entries.push_back(
      ViewEntry{Meta("exp_avg", DType::kFloat32, {oe - ob}, StateClass::kDpSharded, 1001, ob), 0,
                static_cast<uint64_t>((oe - ob) * 4), s.optim.data() + ob * 4});
  v.entries.push_back(ViewEntry{
      Meta("rank" + std::to_string(node) + "/rng", DType::kUInt8, {16}, StateClass::kPrivate), 0,
      16, s.rng[node].data()});
  return v;
}

void WriteJob(Env* env, const std::string& root, const JobState& s, int64_t step, int nodes) {
  WriteOptions wo;
  wo.chunk_bytes = 4096 * 3;  // small chunks: many staged writes
  for (int n = nodes - 1; n >= 1; --n) {
    ASSERT_TRUE(WriteNodePart(env, root, NodeView(s, step, n, nodes), wo).ok());
  }
  auto r = WriteVersion(env, root, NodeView(s, step, 0, nodes), wo, Deadline::AfterSeconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
}

// Restores exp_avg as DP rank r of d and compares with the truth.
void ExpectOptimShards(Env* env, const std::string& root, const JobState& s, int d) {
  for (int r = 0; r < d; ++r) {
    auto [b, e] = ShardRange(1001, r, d);
    if (e <= b) continue;
    std::vector<uint8_t> out((e - b) * 4, 0xAB);
    auto rep = Restore(
        env, root, std::nullopt,
        {RestoreTarget{Meta("exp_avg", DType::kFloat32, {e - b}, StateClass::kDpSharded, 1001, b),
                       out.data()}});
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_EQ(0, std::memcmp(out.data(), s.optim.data() + b * 4, out.size()))
        << "dp rank " << r << " of " << d;
  }
}

TEST(SafetensorsTest, HeaderRoundTripAndValidation) {
  ScratchDir dir("tier-st");
  std::vector<SafetensorsEntry> entries{{"a", "F32", {2, 3}, 0, 24}, {"b", "U8", {5}, 24, 29}};
  std::string h = EncodeSafetensorsHeader(entries, {{"format", "memento"}});
  EXPECT_EQ(h.size() % 8, 0u);
  std::string path = dir.path() + "/x.safetensors";
  {
    std::ofstream f(path, std::ios::binary);
    f << h << std::string(29, 'x');
  }
  auto file = Env::Default()->NewRandomAccessFile(path, false);
  ASSERT_TRUE(file.ok());
  auto parsed = ReadSafetensorsHeader(file->get(), h.size() + 29, path);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->entries.size(), 2u);
  EXPECT_EQ(parsed->entries[0].key, "a");
  EXPECT_EQ(parsed->entries[1].shape, std::vector<int64_t>{5});
  EXPECT_EQ(parsed->metadata["format"], "memento");
  // One byte more than the tensors cover: rejected with the numbers.
  auto bad = ReadSafetensorsHeader(file->get(), h.size() + 30, path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("file has"), std::string::npos) << bad.status();
}

// A number written as a float that no integer type holds (1e30) where an
// integer belongs: converting it was undefined behaviour (tier_index fuzz
// target); it now reads as a missing field, a DataLoss naming the file.
TEST(FormatTest, HugeFloatWhereAnIntegerBelongsIsDataLoss) {
  auto m = ParseNodeMarker(
      R"({"format_version":1,"node":0,"step":1e30,"epoch":1,"file":"f","file_size":1,)"
      R"("manifest":"m","manifest_size":1,"manifest_xxh3":"0000000000000001"})",
      "node-00000.done");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(m.status().message().find("node-00000.done"), std::string::npos) << m.status();
  auto ok =
      ParseNodeMarker(R"({"format_version":1,"node":0,"step":7,"epoch":1,"file":"f","file_size":1,)"
                      R"("manifest":"m","manifest_size":1,"manifest_xxh3":"0000000000000001"})",
                      "node-00000.done");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->step, 7);
}

// A shape whose element count wraps around 2^64 (2^32 x 2^32 bytes: 0 after
// the wrap) matched an empty byte range and was accepted with that shape
// (fuzz/corpus/safetensors_header/regression-shape-overflow).
TEST(SafetensorsTest, ShapeOverflowIsRejected) {
  ScratchDir dir("tier-st-overflow");
  std::string json = R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  json.append((8 - (8 + json.size()) % 8) % 8, ' ');
  std::string h(8, '\0');
  for (int i = 0; i < 8; ++i) h[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  h += json;
  std::string path = dir.path() + "/x.safetensors";
  {
    std::ofstream f(path, std::ios::binary);
    f << h;
  }
  auto file = Env::Default()->NewRandomAccessFile(path, false);
  ASSERT_TRUE(file.ok());
  auto parsed = ReadSafetensorsHeader(file->get(), h.size(), path);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("more than 2^64"), std::string::npos) << parsed.status();
}

TEST(TierTest, WriteRestoreSameTopologyTwoNodes) {
  ScratchDir dir("tier-rt");
  Env* env = Env::Default();
  JobState s = MakeState(testing::TestSeed("WriteRestoreSameTopologyTwoNodes"), 2);
  WriteJob(env, dir.path(), s, 7, 2);
  auto latest = LatestCompleteVersion(env, dir.path());
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, 7);
  std::vector<uint8_t> w(s.weight.size()), b(s.bias.size()), r0(16), r1(16);
  auto rep = Restore(env, dir.path(), 7,
                     {RestoreTarget{Meta("w", DType::kFloat32, {64, 33}), w.data()},
                      RestoreTarget{Meta("b", DType::kBFloat16, {7}), b.data()},
                      RestoreTarget{Meta("rank0/rng", DType::kUInt8, {16}), r0.data()},
                      RestoreTarget{Meta("rank1/rng", DType::kUInt8, {16}), r1.data()}});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(w, s.weight);
  EXPECT_EQ(b, s.bias);
  EXPECT_EQ(r0, s.rng[0]);
  EXPECT_EQ(r1, s.rng[1]);
  ExpectOptimShards(env, dir.path(), s, 2);
  auto report = Verify(env, dir.path(), std::nullopt);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << ::testing::PrintToString(report->versions[0].problems);
  auto index = LoadIndex(env, dir.path(), 7);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->nodes.size(), 2u);
  EXPECT_EQ(index->tensors.at("exp_avg").shape, std::vector<int64_t>{1001});
  EXPECT_EQ(index->tensors.at("w").pieces.size(), 2u);
}

TEST(TierTest, ReshardToOtherDpSizes) {
  ScratchDir dir("tier-reshard");
  Env* env = Env::Default();
  for (int written : {1, 2, 3}) {
    JobState s = MakeState(100 + written, written);
    WriteJob(env, dir.path(), s, 10 + written, written);
    for (int d : {1, 2, 3, 4, 7}) ExpectOptimShards(env, dir.path(), s, d);
    // The whole optimizer tensor as an unsharded (DP=1, no ZeRO) target.
    std::vector<uint8_t> all(1001 * 4);
    auto rep = Restore(
        env, dir.path(), std::nullopt,
        {RestoreTarget{Meta("exp_avg", DType::kFloat32, {1001}, StateClass::kDpSharded, 1001, 0),
                       all.data()}});
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_EQ(all, s.optim);
    // A piece of the replicated weight (what one node of another DP size holds).
    std::vector<uint8_t> part(1000);
    rep = Restore(env, dir.path(), std::nullopt,
                  {RestoreTarget{Meta("w", DType::kFloat32, {64, 33}), part.data(), 3000, 1000}});
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_EQ(0, std::memcmp(part.data(), s.weight.data() + 3000, 1000));
  }
}

TEST(TierTest, RestoreListsEveryProblemAndWritesNothing) {
  ScratchDir dir("tier-bad");
  Env* env = Env::Default();
  JobState s = MakeState(5, 1);
  WriteJob(env, dir.path(), s, 3, 1);
  std::vector<uint8_t> w(s.weight.size(), 0xAB), b(64, 0xAB), x(8, 0xAB), o(2000 * 4, 0xAB);
  auto rep = Restore(
      env, dir.path(), 3,
      {RestoreTarget{Meta("w", DType::kFloat32, {64, 33}), w.data()},
       RestoreTarget{Meta("b", DType::kFloat32, {7}), b.data()},       // wrong dtype
       RestoreTarget{Meta("w", DType::kFloat32, {33, 64}), w.data()},  // wrong shape
       RestoreTarget{Meta("nope", DType::kUInt8, {8}), x.data()},      // missing
       RestoreTarget{Meta("exp_avg", DType::kFloat32, {2000}, StateClass::kDpSharded, 2000, 0),
                     o.data()}});  // different global size
  ASSERT_FALSE(rep.ok());
  const std::string& msg = rep.status().message();
  EXPECT_NE(msg.find("'b': dtype F32 requested"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'w': shape [33, 64] requested"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'nope' is not in version 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'exp_avg': global_numel 2000"), std::string::npos) << msg;
  EXPECT_EQ(w, std::vector<uint8_t>(s.weight.size(), 0xAB)) << "nothing may be written";
  // Restore from a version that does not exist.
  rep =
      Restore(env, dir.path(), 4, {RestoreTarget{Meta("w", DType::kFloat32, {64, 33}), w.data()}});
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), StatusCode::kNotFound);
}

TEST(TierTest, MissingPieceIsReportedNotGuessed) {
  ScratchDir dir("tier-gap");
  Env* env = Env::Default();
  JobState s = MakeState(6, 2);
  // Node 1 leaves out its piece of "w": bytes [4224, 8448) are stored nowhere.
  VersionView v1 = NodeView(s, 1, 1, 2);
  v1.entries.erase(v1.entries.begin());
  ASSERT_TRUE(WriteNodePart(env, dir.path(), v1, {}).ok());
  ASSERT_TRUE(
      WriteVersion(env, dir.path(), NodeView(s, 1, 0, 2), {}, Deadline::AfterSeconds(5)).ok());
  std::vector<uint8_t> w(s.weight.size(), 0xAB);
  auto rep =
      Restore(env, dir.path(), 1, {RestoreTarget{Meta("w", DType::kFloat32, {64, 33}), w.data()}});
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.status().message().find("bytes [4224, 8448) are in no stored piece"),
            std::string::npos)
      << rep.status();
  EXPECT_EQ(w, std::vector<uint8_t>(s.weight.size(), 0xAB));
}

TEST(TierTest, IncompleteVersionDoesNotExist) {
  ScratchDir dir("tier-inc");
  Env* env = Env::Default();
  JobState s = MakeState(7, 2);
  WriteJob(env, dir.path(), s, 1, 2);
  // Version 2: only node 0 finished; node 1 never did.
  auto r = WriteVersion(env, dir.path(), NodeView(s, 2, 0, 2), {}, Deadline::AfterSeconds(0.05));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("node(s) 1"), std::string::npos) << r.status();
  EXPECT_EQ(*LatestCompleteVersion(env, dir.path()), 1);
  auto versions = ListVersions(env, dir.path());
  ASSERT_TRUE(versions.ok());
  ASSERT_EQ(versions->size(), 2u);
  EXPECT_FALSE((*versions)[1].complete);
  EXPECT_EQ((*versions)[1].nodes_done, std::vector<int>{0});
  auto check = Verify(env, dir.path(), 2);
  ASSERT_TRUE(check.ok());
  EXPECT_FALSE(check->ok());
  EXPECT_NE(check->versions[0].problems[0].find("no COMMIT marker"), std::string::npos);
  // Node 1 finishes late: node 0's commit now goes through.
  ASSERT_TRUE(WriteNodePart(env, dir.path(), NodeView(s, 2, 1, 2), {}).ok());
  ASSERT_TRUE(CommitVersion(env, dir.path(), 2, 2).ok());
  EXPECT_EQ(*LatestCompleteVersion(env, dir.path()), 2);
  // Writing a committed version again is refused.
  auto again = WriteNodePart(env, dir.path(), NodeView(s, 2, 1, 2), {});
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
}

TEST(TierTest, VerifyNamesCorruption) {
  ScratchDir dir("tier-verify");
  Env* env = Env::Default();
  JobState s = MakeState(8, 2);
  WriteJob(env, dir.path(), s, 5, 2);
  const std::string vdir = dir.path() + "/" + VersionDirName(5);
  const std::string file = vdir + "/" + NodeDataFileName(1);
  auto index = LoadIndex(env, dir.path(), 5);
  ASSERT_TRUE(index.ok());
  // Flip one byte inside node 1's piece of "w".
  const PieceRecord* victim = nullptr;
  for (const auto& p : index->tensors.at("w").pieces) {
    if (p.node == 1) victim = &p;
  }
  ASSERT_NE(victim, nullptr);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(victim->file_offset + 10);
    char c;
    f.read(&c, 1);
    c ^= 0x40;
    f.seekp(victim->file_offset + 10);
    f.write(&c, 1);
  }
  auto report = Verify(env, dir.path(), 5);
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->versions[0].problems.size(), 1u);
  EXPECT_NE(report->versions[0].problems[0].find("piece 'w#4224'"), std::string::npos)
      << report->versions[0].problems[0];
  EXPECT_NE(report->versions[0].problems[0].find("fails its checksum"), std::string::npos);
  std::vector<uint8_t> w(s.weight.size());
  auto rep =
      Restore(env, dir.path(), 5, {RestoreTarget{Meta("w", DType::kFloat32, {64, 33}), w.data()}});
  EXPECT_EQ(rep.status().code(), StatusCode::kDataLoss) << rep.status();
  // Truncation is named as such.
  ASSERT_EQ(0, truncate(file.c_str(), 100));
  report = Verify(env, dir.path(), 5);
  ASSERT_TRUE(report.ok());
  EXPECT_NE(report->versions[0].problems[0].find("100 bytes, index says"), std::string::npos)
      << report->versions[0].problems[0];
  // A tampered index no longer matches COMMIT.
  {
    std::ofstream f(vdir + "/index.json", std::ios::app);
    f << " ";
  }
  report = Verify(env, dir.path(), 5);
  ASSERT_TRUE(report.ok());
  EXPECT_NE(report->versions[0].problems[0].find("COMMIT says"), std::string::npos)
      << report->versions[0].problems[0];
}

TEST(TierTest, RetentionKeepsLastAndEveryMth) {
  ScratchDir dir("tier-ret");
  Env* env = Env::Default();
  JobState s = MakeState(9, 1);
  for (int step = 1; step <= 10; ++step) {
    if (step == 4) continue;
    WriteJob(env, dir.path(), s, step, 1);
  }
  // An abandoned partial write (older than the newest complete) and one in progress (newer).
  for (int step : {4, 12}) {
    ASSERT_TRUE(WriteNodePart(env, dir.path(), NodeView(s, step, 0, 2), {}).ok());
  }
  auto rep = ApplyRetention(env, dir.path(), RetentionPolicy{3, 5});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->kept, (std::vector<int64_t>{5, 8, 9, 10}));
  EXPECT_EQ(rep->deleted, (std::vector<int64_t>{1, 2, 3, 6, 7}));
  EXPECT_EQ(rep->cleaned_incomplete, std::vector<int64_t>{4});
  auto versions = ListVersions(env, dir.path());
  ASSERT_TRUE(versions.ok());
  std::vector<int64_t> left;
  for (const auto& v : *versions) left.push_back(v.step);
  EXPECT_EQ(left, (std::vector<int64_t>{5, 8, 9, 10, 12}));
  // keep_last 0 still keeps the newest complete version.
  rep = ApplyRetention(env, dir.path(), RetentionPolicy{0, 0});
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->kept, std::vector<int64_t>{10});
  EXPECT_EQ(*LatestCompleteVersion(env, dir.path()), 10);
}

class FakeMemoryTier : public VersionSource {
 public:
  explicit FakeMemoryTier(Result<std::optional<int64_t>> answer) : answer_(std::move(answer)) {}
  std::string name() const override { return "memory"; }
  Result<std::optional<int64_t>> LatestComplete(Deadline) override { return answer_; }

 private:
  Result<std::optional<int64_t>> answer_;
};

TEST(DiscoveryTest, NewestAcrossTiersMemoryWinsTies) {
  ScratchDir dir("tier-disc");
  Env* env = Env::Default();
  JobState s = MakeState(10, 1);
  WriteJob(env, dir.path(), s, 20, 1);
  DurableVersionSource durable(env, dir.path());
  FakeMemoryTier newer(std::optional<int64_t>(25)), same(std::optional<int64_t>(20)),
      none{std::optional<int64_t>(std::nullopt)}, down(UnavailableError("agent node3 unreachable"));
  auto r = FindLatestComplete({&newer, &durable}, Deadline::AfterSeconds(1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->step, 25);
  EXPECT_EQ(r->source, "memory");
  r = FindLatestComplete({&same, &durable}, Deadline::AfterSeconds(1));
  EXPECT_EQ(r->source, "memory");
  r = FindLatestComplete({&down, &durable}, Deadline::AfterSeconds(1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->step, 20);
  EXPECT_EQ(r->source, "durable:" + dir.path());
  ASSERT_EQ(r->skipped.size(), 1u);
  ScratchDir empty("tier-disc-empty");
  DurableVersionSource nothing(env, empty.path());
  r = FindLatestComplete({&none, &nothing}, Deadline::AfterSeconds(1));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace memento::tier

namespace memento::tier {
namespace {

// Page-aligned sources take the zero-copy direct-write path where the stream
// position allows it, and the copy path elsewhere; both must give the same
// file a reader understands.
TEST(TierTest, ZeroCopyAndStagedPathsMix) {
  ScratchDir dir("tier-zc");
  Env* env = Env::Default();
  std::mt19937_64 rng(testing::TestSeed("ZeroCopyAndStagedPathsMix"));
  const std::vector<uint64_t> sizes{4096 * 5, 100, 4096 * 3, 4096 * 2 + 12, 4096, 8};
  std::vector<AlignedBuffer> bufs;
  VersionView v;
  v.step = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    bufs.emplace_back(sizes[i]);
    for (uint64_t j = 0; j < sizes[i]; ++j) bufs[i].data()[j] = static_cast<uint8_t>(rng());
    v.entries.push_back(
        ViewEntry{Meta("t" + std::to_string(i), DType::kUInt8, {static_cast<int64_t>(sizes[i])}), 0,
                  sizes[i], bufs[i].data()});
  }
  WriteOptions wo;
  wo.chunk_bytes = 4096 * 2;
  auto ws = WriteVersion(env, dir.path(), v, wo, Deadline::AfterSeconds(5));
  ASSERT_TRUE(ws.ok()) << ws.status();
  std::vector<std::vector<uint8_t>> out;
  std::vector<RestoreTarget> targets;
  for (size_t i = 0; i < sizes.size(); ++i) out.emplace_back(sizes[i]);
  for (size_t i = 0; i < sizes.size(); ++i) {
    targets.push_back(RestoreTarget{v.entries[i].meta, out[i].data()});
  }
  RestoreOptions ro;
  ro.chunk_bytes = 4096 * 3;
  ro.verify_before_write = true;
  auto rep = Restore(env, dir.path(), 1, targets, ro);
  ASSERT_TRUE(rep.ok()) << rep.status();
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(out[i].data(), bufs[i].data(), sizes[i])) << "tensor " << i;
  }
  auto report = Verify(env, dir.path(), 1);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << ::testing::PrintToString(report->versions[0].problems);
}

}  // namespace
}  // namespace memento::tier

namespace memento::tier {
namespace {

// A step trained again after a restart (new epoch) is never committed from a
// part left by the earlier history.
TEST(TierTest, PartsOfAnotherEpochAreNeverMixed) {
  ScratchDir dir("tier-epoch");
  Env* env = Env::Default();
  JobState old_state = MakeState(11, 2), new_state = MakeState(12, 2);
  VersionView stale = NodeView(old_state, 5, 1, 2);  // epoch 0, node 1, never committed
  ASSERT_TRUE(WriteNodePart(env, dir.path(), stale, {}).ok());
  VersionView v0 = NodeView(new_state, 5, 0, 2), v1 = NodeView(new_state, 5, 1, 2);
  v0.epoch = v1.epoch = 1;
  auto r = WriteVersion(env, dir.path(), v0, {}, Deadline::AfterSeconds(0.05));
  ASSERT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("from epoch 0, waiting for epoch 1"), std::string::npos);
  ASSERT_TRUE(WriteNodePart(env, dir.path(), v1, {}).ok());
  ASSERT_TRUE(CommitVersion(env, dir.path(), 5, 2, 1).ok());
  std::vector<uint8_t> w(new_state.weight.size());
  ASSERT_TRUE(
      Restore(env, dir.path(), 5, {RestoreTarget{Meta("w", DType::kFloat32, {64, 33}), w.data()}})
          .ok());
  EXPECT_EQ(w, new_state.weight);
}

// Every T seconds: the first offer is due, the next ones only after T.
TEST(PersisterPolicyTest, EveryTSecondsOnly) {
  ScratchDir dir("tier-every-t");
  std::vector<uint8_t> bytes(4096, 7);
  auto provider = [&]() -> Result<VersionView> {
    VersionView v;
    v.entries.push_back(ViewEntry{Meta("x", DType::kUInt8, {4096}), 0, 4096, bytes.data()});
    return v;
  };
  for (double t : {30.0, 0.3}) {
    PersisterOptions o;
    o.root = dir.path() + "/" + std::to_string(static_cast<int>(t * 10));
    o.every_k_steps = 0;
    o.every_seconds = t;
    auto p = Persister::Start(o);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ((*p)->Offer(1, provider), OfferResult::kQueued);
    if (t > 1) {
      EXPECT_EQ((*p)->Offer(2, provider), OfferResult::kSkippedByPolicy);  // long before 30 s
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(350));  // always > 0.3 s
      EXPECT_NE((*p)->Offer(2, provider), OfferResult::kSkippedByPolicy);
    }
    ASSERT_TRUE((*p)->WaitIdle(Deadline::AfterSeconds(30)));
  }
}

}  // namespace
}  // namespace memento::tier

namespace memento::tier {
namespace {

// Another PP split where layer boundaries allow: written by PP=2 (node 0 holds
// layers 0-1, node 1 layers 2-3), restored by PP=4 (one layer per rank) and
// PP=1 (all layers on one rank), tensors found by name whoever wrote them.
TEST(TierTest, RestoreIntoAnotherPipelineSplit) {
  ScratchDir dir("tier-pp");
  Env* env = Env::Default();
  std::mt19937_64 rng(testing::TestSeed("RestoreIntoAnotherPipelineSplit"));
  std::vector<std::vector<uint8_t>> layers;
  for (int l = 0; l < 4; ++l) layers.push_back(RandomBytes(rng, 4096 + 40 * l));
  auto meta = [&](int l) {
    return Meta("layers." + std::to_string(l) + ".weight", DType::kFloat32,
                {static_cast<int64_t>(layers[l].size() / 4)});
  };
  for (int node = 1; node >= 0; --node) {
    VersionView v;
    v.step = 3;
    v.node = node;
    v.num_nodes = 2;
    v.topology_json = R"({"pp": 2})";
    for (int l = 2 * node; l < 2 * node + 2; ++l) {
      v.entries.push_back(ViewEntry{meta(l), 0, layers[l].size(), layers[l].data()});
    }
    auto r = node == 1 ? WriteNodePart(env, dir.path(), v, {})
                       : WriteVersion(env, dir.path(), v, {}, Deadline::AfterSeconds(5));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  for (int pp : {4, 1}) {
    for (int stage = 0; stage < pp; ++stage) {
      std::vector<std::vector<uint8_t>> out;
      std::vector<RestoreTarget> targets;
      for (int l = stage * 4 / pp; l < (stage + 1) * 4 / pp; ++l)
        out.emplace_back(layers[l].size());
      int i = 0;
      for (int l = stage * 4 / pp; l < (stage + 1) * 4 / pp; ++l, ++i) {
        targets.push_back(RestoreTarget{meta(l), out[i].data()});
      }
      auto rep = Restore(env, dir.path(), 3, targets);
      ASSERT_TRUE(rep.ok()) << rep.status();
      i = 0;
      for (int l = stage * 4 / pp; l < (stage + 1) * 4 / pp; ++l, ++i) {
        EXPECT_EQ(out[i], layers[l]) << "pp=" << pp << " layer " << l;
      }
    }
  }
}

// TP re-cut (Megatron-LM style): a column-parallel weight (split on dim 0), a
// row-parallel weight (split on dim 1), a column-parallel bias (BF16) and a
// replicated norm weight, saved by two nodes with TP 2 (one TP rank each,
// some slices stored as two byte pieces that do not end on a row), restored
// with TP 1, 2, 3, 4 and 5 (uneven: the last rank takes the remainder).
// Every value is compared with a slice cut from the global tensor by a
// direct index computation.
struct TpTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // global
  int dim;                     // split dimension, -1: replicated
  std::vector<uint8_t> bytes;  // global tensor
};

std::vector<uint8_t> CutRows(const TpTensor& t, int64_t b, int64_t e) {
  const size_t es = DTypeSize(t.dtype);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < static_cast<int>(t.shape.size()); ++d) {
    if (d < t.dim) outer *= t.shape[d];
    if (d > t.dim) inner *= t.shape[d];
  }
  std::vector<uint8_t> out;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t r = b; r < e; ++r) {
      for (int64_t i = 0; i < inner; ++i) {
        const size_t elem = static_cast<size_t>((o * t.shape[t.dim] + r) * inner + i);
        out.insert(out.end(), t.bytes.begin() + elem * es, t.bytes.begin() + (elem + 1) * es);
      }
    }
  }
  return out;
}

std::vector<TpTensor> MakeTpModel(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<TpTensor> model = {
      {"attn.qkv.weight", DType::kFloat32, {12, 10}, 0, {}},
      {"attn.proj.weight", DType::kFloat32, {10, 12}, 1, {}},
      {"mlp.fc.bias", DType::kBFloat16, {12}, 0, {}},
      {"ln.weight", DType::kFloat32, {10}, -1, {}},
  };
  for (auto& t : model) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    t.bytes = RandomBytes(rng, static_cast<size_t>(n) * DTypeSize(t.dtype));
  }
  return model;
}

// Writes `model` as `tp` TP ranks spread over `tp` nodes (tp 1: unsplit).
void WriteTp(Env* env, const std::string& root, const std::vector<TpTensor>& model, int64_t step,
             int tp) {
  std::vector<std::vector<std::vector<uint8_t>>> local(tp);
  for (int node = tp - 1; node >= 0; --node) {
    VersionView v;
    v.job = "job-tp";
    v.step = step;
    v.node = node;
    v.num_nodes = tp;
    v.topology_json = R"({"tp": )" + std::to_string(tp) + "}";
    for (const TpTensor& t : model) {
      if (t.dim < 0 || tp == 1) {
        if (node != 0) continue;
        v.entries.push_back(
            ViewEntry{Meta(t.name, t.dtype, t.shape), 0, t.bytes.size(), t.bytes.data(), {}});
        continue;
      }
      TpSlice slice = TpSlice::Even(t.shape, t.dim, node, tp);
      local[node].push_back(CutRows(t, slice.begin, slice.end));
      const std::vector<uint8_t>& bytes = local[node].back();
      TensorMeta m = Meta(t.name, t.dtype, slice.LocalShape());
      if (t.name == "attn.qkv.weight") {  // two pieces, cut inside a row
        v.entries.push_back(ViewEntry{m, 0, 52, bytes.data(), slice});
        v.entries.push_back(ViewEntry{m, 52, bytes.size() - 52, bytes.data() + 52, slice});
      } else {
        v.entries.push_back(ViewEntry{m, 0, bytes.size(), bytes.data(), slice});
      }
    }
    auto r = node != 0 ? WriteNodePart(env, root, v, {})
                       : WriteVersion(env, root, v, {}, Deadline::AfterSeconds(5));
    ASSERT_TRUE(r.ok()) << r.status();
  }
}

void ExpectTpRestore(Env* env, const std::string& root, const std::vector<TpTensor>& model,
                     int64_t step, int tp) {
  for (int rank = 0; rank < tp; ++rank) {
    std::vector<std::vector<uint8_t>> out, want;
    std::vector<RestoreTarget> targets;
    for (const TpTensor& t : model) {
      if (t.dim < 0 || tp == 1) {
        want.push_back(t.bytes);
        out.emplace_back(t.bytes.size());
        // TP 1: the whole global tensor, named by its global shape alone.
        targets.push_back(RestoreTarget{Meta(t.name, t.dtype, t.shape), nullptr});
        continue;
      }
      TpSlice slice = TpSlice::Even(t.shape, t.dim, rank, tp);
      want.push_back(CutRows(t, slice.begin, slice.end));
      out.emplace_back(want.back().size(), 0xEE);
      RestoreTarget target{Meta(t.name, t.dtype, slice.LocalShape()), nullptr};
      target.tp = slice;
      targets.push_back(target);
    }
    for (size_t i = 0; i < targets.size(); ++i) targets[i].data = out[i].data();
    auto rep = Restore(env, root, step, targets);
    ASSERT_TRUE(rep.ok()) << "tp " << tp << " rank " << rank << ": " << rep.status();
    for (size_t i = 0; i < model.size(); ++i) {
      EXPECT_EQ(out[i], want[i]) << model[i].name << " at tp " << tp << " rank " << rank;
    }
  }
}

TEST(TierTest, TensorParallelReCut) {
  ScratchDir dir("tier-tp");
  Env* env = Env::Default();
  const std::vector<TpTensor> model = MakeTpModel(testing::TestSeed("TensorParallelReCut"));
  WriteTp(env, dir.path(), model, 5, 2);
  auto index = LoadIndex(env, dir.path(), 5);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->format_version, kFormatVersionTpSlices);
  EXPECT_EQ(index->tensors.at("attn.proj.weight").split_dim, 1);
  EXPECT_EQ(index->tensors.at("attn.proj.weight").shape, (std::vector<int64_t>{10, 12}));
  EXPECT_EQ(index->tensors.at("ln.weight").split_dim, -1);
  auto report = Verify(env, dir.path(), std::nullopt);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << ::testing::PrintToString(report->versions[0].problems);
  for (int tp : {1, 2, 3, 4, 5}) ExpectTpRestore(env, dir.path(), model, 5, tp);

  // Saved unsplit (TP 1), restored as TP slices.
  WriteTp(env, dir.path(), model, 6, 1);
  auto index1 = LoadIndex(env, dir.path(), 6);
  ASSERT_TRUE(index1.ok());
  EXPECT_EQ(index1->format_version, kFormatVersion);  // no TP slice: still version 1
  for (int tp : {2, 4}) ExpectTpRestore(env, dir.path(), model, 6, tp);

  // A slice of another dimension is refused, naming the tensor; nothing written.
  std::vector<uint8_t> buf(5 * 12 * 4, 0xAB);
  RestoreTarget wrong{Meta("attn.proj.weight", DType::kFloat32, {5, 12}), buf.data()};
  wrong.tp = TpSlice::Even({10, 12}, 0, 0, 2);
  auto rep = Restore(env, dir.path(), 5, {wrong});
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rep.status().message().find("attn.proj.weight"), std::string::npos) << rep.status();
  EXPECT_EQ(buf, std::vector<uint8_t>(buf.size(), 0xAB));
}

TEST(TierTest, TensorParallelMissingSliceIsReported) {
  ScratchDir dir("tier-tp-missing");
  Env* env = Env::Default();
  const std::vector<TpTensor> model = MakeTpModel(7);
  // Only TP rank 0's half of the row-parallel weight is stored.
  TpSlice slice = TpSlice::Even({10, 12}, 1, 0, 2);
  std::vector<uint8_t> half = CutRows(model[1], slice.begin, slice.end);
  VersionView v;
  v.step = 9;
  v.entries.push_back(ViewEntry{Meta("attn.proj.weight", DType::kFloat32, slice.LocalShape()), 0,
                                half.size(), half.data(), slice});
  auto w = WriteVersion(env, dir.path(), v, {}, Deadline::AfterSeconds(5));
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<uint8_t> whole(10 * 12 * 4);
  auto rep =
      Restore(env, dir.path(), 9,
              {RestoreTarget{Meta("attn.proj.weight", DType::kFloat32, {10, 12}), whole.data()}});
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.status().message().find("rows [6, 12) of dimension 1"), std::string::npos)
      << rep.status();
  // Its own slice still restores.
  std::vector<uint8_t> back(half.size());
  RestoreTarget own{Meta("attn.proj.weight", DType::kFloat32, slice.LocalShape()), back.data()};
  own.tp = slice;
  rep = Restore(env, dir.path(), 9, {own});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(back, half);
}

}  // namespace
}  // namespace memento::tier

namespace memento::tier {
namespace {

// Node-local versions (the agent without --store): a replicated tensor shared
// by the ranks whose copies are equal, per-rank copies otherwise, resolved by
// RestoreTarget::rank; and a version written before `ranks` existed, whose
// shared copy cannot be trusted for any rank but the node's lowest.
TEST(TierTest, RankScopedReplicatedNamesResolvePerRank) {
  ScratchDir dir("tier-ranks");
  Env* env = Env::Default();
  std::mt19937_64 rng(testing::TestSeed("RankScopedReplicatedNamesResolvePerRank"));
  // Ranks 0 and 2: stage 0 (equal params); rank 1: stage 1 (other bytes).
  const std::vector<uint8_t> stage0 = RandomBytes(rng, 256), stage1 = RandomBytes(rng, 256);
  const std::vector<uint8_t> only1 = RandomBytes(rng, 8);
  auto write = [&](int64_t step, bool legacy) {
    VersionView v;
    v.job = "job-ranks";
    v.step = step;
    v.topology_json = R"({"node": 0, "ranks": [0, 1, 2], "source": "memento agent"})";
    if (legacy) {  // the old writer: "params" from the lowest rank, no ranks
      v.entries.push_back(ViewEntry(Meta("params", DType::kUInt8, {256}), 0, 256, stage0.data()));
    } else {
      ViewEntry e(Meta("rank0/params", DType::kUInt8, {256}), 0, 128, stage0.data());
      e.ranks = {2, 0};
      v.entries.push_back(e);
      e = ViewEntry(Meta("rank0/params", DType::kUInt8, {256}), 128, 128, stage0.data() + 128);
      e.ranks = {0, 2};
      v.entries.push_back(e);
      e = ViewEntry(Meta("rank1/params", DType::kUInt8, {256}), 0, 256, stage1.data());
      e.ranks = {1};
      v.entries.push_back(e);
      e = ViewEntry(Meta("head", DType::kUInt8, {8}), 0, 8, only1.data());
      e.ranks = {1};
      v.entries.push_back(e);
    }
    auto st = WriteVersion(env, dir.path(), v, WriteOptions{}, Deadline::AfterSeconds(10));
    ASSERT_TRUE(st.ok()) << st.status();
  };
  write(10, /*legacy=*/false);
  auto index = LoadIndex(env, dir.path(), 10);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->tensors.at("rank0/params").ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(*RankTensorName(*index, 0, "params"), "rank0/params");
  EXPECT_EQ(*RankTensorName(*index, 2, "params"), "rank0/params");
  EXPECT_EQ(*RankTensorName(*index, 1, "params"), "rank1/params");
  EXPECT_EQ(*RankTensorName(*index, 1, "head"), "head");
  EXPECT_EQ(RankTensorName(*index, 0, "head").status().code(), StatusCode::kNotFound);
  std::vector<std::vector<uint8_t>> got(3, std::vector<uint8_t>(256));
  std::vector<RestoreTarget> targets;
  for (int r = 0; r < 3; ++r) {
    targets.emplace_back(Meta("params", DType::kUInt8, {256}), got[r].data());
    targets.back().rank = r;
  }
  auto rep = Restore(env, dir.path(), 10, targets);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(got[0], stage0);
  EXPECT_EQ(got[1], stage1);
  EXPECT_EQ(got[2], stage0);
  auto report = Verify(env, dir.path(), 10);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << ::testing::PrintToString(report->versions[0].problems);

  // A version of the old writer: rank 0's copy is its own, the others' are refused.
  write(20, /*legacy=*/true);
  index = LoadIndex(env, dir.path(), 20);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_TRUE(index->tensors.at("params").ranks.empty());
  EXPECT_EQ(*RankTensorName(*index, 0, "params"), "params");
  auto legacy = RankTensorName(*index, 1, "params");
  EXPECT_EQ(legacy.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(legacy.status().message().find("cannot be trusted for rank 1"), std::string::npos)
      << legacy.status();
  std::vector<uint8_t> sentinel(256, 0xAB);
  got[1] = sentinel;
  rep = Restore(env, dir.path(), 20, targets);
  EXPECT_EQ(rep.status().code(), StatusCode::kFailedPrecondition) << rep.status();
  EXPECT_EQ(got[1], sentinel);  // nothing written
  targets.resize(1);
  rep = Restore(env, dir.path(), 20, targets);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(got[0], stage0);
  // The stored name as is (rank -1) still reads the old copy.
  std::vector<uint8_t> plain(256);
  rep = Restore(env, dir.path(), 20,
                {RestoreTarget(Meta("params", DType::kUInt8, {256}), plain.data())});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(plain, stage0);
}

}  // namespace
}  // namespace memento::tier
