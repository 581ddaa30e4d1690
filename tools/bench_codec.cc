// `memento bench codec`: encode/decode throughput of memento's codec path next
// to raw ISA-L calls on the same buffers in the same run, for xor and rs:2 at
// D = 4 and 8 (stripes of k = D - f data blocks, as the planner builds them),
// plus the planner's time for a 10,240-node topology. Prints one JSON object.
#include <isa-l/erasure_code.h>
#include <isa-l/raid.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "codec/erasure_code.h"
#include "common/byte_flag.h"
#include "common/check.h"
#include "common/clock.h"
#include "recover/recover.h"
#include "tools/command.h"
#include "tools/json_output.h"
#include "topo/plan.h"

namespace memento::tools {
namespace {

struct CodecBenchOptions {
  size_t block_mib = 4;
  int reps = 7;
  bool json = true;
  int planner_dp = 64, planner_tp = 8, planner_pp = 20;
};

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, AlignedFree>;

Buffer Alloc(size_t n) {
  void* p = nullptr;
  MEMENTO_CHECK(posix_memalign(&p, 64, n) == 0);
  std::memset(p, 0, n);
  return Buffer(static_cast<uint8_t*>(p));
}

// Best-of-reps seconds for two functions run alternately, so both see the
// same machine load.
template <typename A, typename B>
std::pair<double, double> BestOf(int reps, A&& a, B&& b) {
  double ba = 1e30, bb = 1e30;
  a();  // warm up caches and page tables
  b();
  for (int i = 0; i < reps; ++i) {
    Stopwatch sa;
    a();
    ba = std::min(ba, sa.Seconds());
    Stopwatch sb;
    b();
    bb = std::min(bb, sb.Seconds());
  }
  return {ba, bb};
}

nlohmann::json Measure(bool xor_code, int d, const CodecBenchOptions& o) {
  const int f = xor_code ? 1 : 2;
  const int k = d - f;
  const size_t len = o.block_mib << 20;
  std::mt19937_64 rng(d * 10 + f);
  std::vector<Buffer> blocks;
  std::vector<uint8_t*> ptr;
  for (int i = 0; i < k + f; ++i) {
    blocks.push_back(Alloc(len));
    ptr.push_back(blocks.back().get());
  }
  for (int i = 0; i < k; ++i) {
    for (size_t b = 0; b < len; b += 8) {
      const uint64_t v = rng();
      std::memcpy(ptr[i] + b, &v, 8);
    }
  }
  auto code =
      codec::ErasureCode::Create(xor_code ? codec::CodeKind::kXor : codec::CodeKind::kRs, k, f);
  MEMENTO_CHECK(code.ok());

  // Raw ISA-L: tables prepared outside the timed region, as any caller would.
  std::vector<uint8_t> matrix(static_cast<size_t>(k + f) * k);
  gf_gen_cauchy1_matrix(matrix.data(), k + f, k);
  std::vector<uint8_t> enc_tables(static_cast<size_t>(32) * k * f);
  ec_init_tables(k, f, matrix.data() + static_cast<size_t>(k) * k, enc_tables.data());
  std::vector<void*> xor_array(k + 1);
  for (int i = 0; i < k; ++i) xor_array[i] = ptr[i];
  xor_array[k] = ptr[k];

  auto ours_encode = [&] { code->Encode(len, ptr.data(), ptr.data() + k); };
  auto raw_encode = [&] {
    if (xor_code) {
      MEMENTO_CHECK(xor_gen(k + 1, static_cast<int>(len), xor_array.data()) == 0);
    } else {
      ec_encode_data(static_cast<int>(len), k, f, enc_tables.data(), ptr.data(), ptr.data() + k);
    }
  };
  auto [enc_ours, enc_raw] = BestOf(o.reps, ours_encode, raw_encode);

  // Decode: lose data blocks 0..f-1, rebuild them from the rest.
  std::vector<int> available, wanted;
  for (int i = 0; i < f; ++i) wanted.push_back(i);
  for (int i = f; i < k + f; ++i) available.push_back(i);
  auto dec = code->MakeDecoder(available, wanted);
  MEMENTO_CHECK(dec.ok());
  std::vector<const uint8_t*> in;
  for (int a : available) in.push_back(ptr[a]);
  std::vector<Buffer> outs;
  std::vector<uint8_t*> out;
  for (int i = 0; i < f; ++i) {
    outs.push_back(Alloc(len));
    out.push_back(outs.back().get());
  }
  // Raw decode tables: invert the surviving rows (ISA-L erasure_code_test style).
  std::vector<uint8_t> b(static_cast<size_t>(k) * k), inv(static_cast<size_t>(k) * k);
  for (int r = 0; r < k; ++r) {
    std::memcpy(&b[static_cast<size_t>(r) * k], &matrix[static_cast<size_t>(available[r]) * k], k);
  }
  MEMENTO_CHECK(gf_invert_matrix(b.data(), inv.data(), k) == 0);
  std::vector<uint8_t> dec_rows(static_cast<size_t>(f) * k);
  for (int i = 0; i < f; ++i) {
    std::memcpy(&dec_rows[static_cast<size_t>(i) * k], &inv[static_cast<size_t>(wanted[i]) * k], k);
  }
  std::vector<uint8_t> dec_tables(static_cast<size_t>(32) * k * f);
  ec_init_tables(k, f, dec_rows.data(), dec_tables.data());
  std::vector<uint8_t*> raw_in;
  for (int a : available) raw_in.push_back(ptr[a]);
  std::vector<void*> xor_dec(k + 1);
  for (int i = 0; i < k; ++i) xor_dec[i] = raw_in[i];
  xor_dec[k] = out[0];

  auto ours_decode = [&] { dec->Decode(len, in.data(), out.data()); };
  auto raw_decode = [&] {
    if (xor_code) {
      MEMENTO_CHECK(xor_gen(k + 1, static_cast<int>(len), xor_dec.data()) == 0);
    } else {
      ec_encode_data(static_cast<int>(len), k, f, dec_tables.data(), raw_in.data(), out.data());
    }
  };
  auto [dec_ours, dec_raw] = BestOf(o.reps, ours_decode, raw_decode);
  // The decode really rebuilt the lost blocks.
  ours_decode();
  for (int i = 0; i < f; ++i) MEMENTO_CHECK(std::memcmp(out[i], ptr[i], len) == 0);

  const double data_bytes = static_cast<double>(len) * k;
  auto entry = [&](double ours, double raw) {
    return nlohmann::json{{"ours_gbps", data_bytes / ours / 1e9},
                          {"raw_gbps", data_bytes / raw / 1e9},
                          {"ratio", raw / ours}};
  };
  return {{"scheme", xor_code ? "xor" : "rs:2"},
          {"D", d},
          {"k", k},
          {"f", f},
          {"block_bytes", len},
          {"encode", entry(enc_ours, enc_raw)},
          {"decode", entry(dec_ours, dec_raw)}};
}

nlohmann::json PlannerTime(const CodecBenchOptions& o) {
  auto topology = topo::Topology::Uniform(o.planner_dp, o.planner_tp, o.planner_pp, 1, 1);
  MEMENTO_CHECK(topology.ok());
  topo::Inventory inv(topology->num_ranks());
  for (auto& r : inv) {
    TensorMeta p;
    p.name = "params";
    p.dtype = DType::kBFloat16;
    p.shape = {int64_t{1} << 28};
    r.push_back(p);
    TensorMeta s;
    s.name = "optimizer";
    s.dtype = DType::kFloat32;
    s.shape = {int64_t{3} << 26};
    s.state_class = StateClass::kDpSharded;
    r.push_back(s);
    TensorMeta g;
    g.name = "rng";
    g.dtype = DType::kUInt8;
    g.shape = {4096};
    g.state_class = StateClass::kPrivate;
    r.push_back(g);
  }
  nlohmann::json out = {{"dp", o.planner_dp},
                        {"tp", o.planner_tp},
                        {"pp", o.planner_pp},
                        {"ranks", topology->num_ranks()},
                        {"nodes", topology->num_nodes()}};
  for (const char* policy : {"xor", "rs:2", "replicate"}) {
    Stopwatch sw;
    auto plan = topo::MakePlan(*topology, inv, *topo::ParsePolicy(policy));
    const double plan_s = sw.Seconds();
    MEMENTO_CHECK(plan.ok());
    Stopwatch rw;
    auto rec = recover::PlanFailure(*plan, {0, topology->num_nodes() / 2});
    const double rec_s = rw.Seconds();
    MEMENTO_CHECK(rec.ok());
    out[policy] = {{"planner_seconds", plan_s},
                   {"recover_seconds", rec_s},
                   {"pieces", plan->pieces.size()},
                   {"stripes", plan->stripes.size()},
                   {"protection", plan->protection}};
  }
  out["planner_seconds"] = out["xor"]["planner_seconds"];
  return out;
}

void Setup(CLI::App& bench, CommandContext& ctx) {
  auto* cmd = bench.add_subcommand("codec", "Codec throughput vs raw ISA-L, and planner time");
  auto o = std::make_shared<CodecBenchOptions>();
  cmd->add_option("--block-mib", o->block_mib, "bytes per stripe block, MiB")
      ->transform(ByteSize(uint64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--reps", o->reps, "repetitions (best of)")->capture_default_str();
  cmd->add_flag("--json", o->json, "print JSON (always on)");
  cmd->callback([o, &ctx] {
    if (o->block_mib == 0 || o->block_mib > 1024 || o->reps < 1) {
      ctx.exit_code = ReportStatus(InvalidArgumentError("--block-mib in 1..1024, --reps >= 1"));
      return;
    }
    nlohmann::json j;
    j["bench"] = "codec";
    nlohmann::json results = nlohmann::json::array();
    double min_ratio = 1e9;
    for (bool xor_code : {true, false}) {
      for (int d : {4, 8}) {
        results.push_back(Measure(xor_code, d, *o));
        min_ratio = std::min({min_ratio, results.back()["encode"]["ratio"].get<double>(),
                              results.back()["decode"]["ratio"].get<double>()});
      }
    }
    j["results"] = std::move(results);
    j["min_ratio"] = min_ratio;
    j["planner"] = PlannerTime(*o);
    j["planner_seconds"] = j["planner"]["planner_seconds"];
    memento::tools::PrintJson("memento.bench.codec/1", std::move(j));
  });
}

}  // namespace
}  // namespace memento::tools

MEMENTO_REGISTER_BENCH(codec, memento::tools::Setup);
