// `memento bench tcp --bytes N [--chunk C] [--json]`: raw loopback TCP
// throughput between two processes (the `tcp_gbps` baseline) next to the
// memento transport (framed, xxHash3-checksummed, authenticated) over the
// same bytes, and their ratio. Prints one JSON object.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/byte_flag.h"
#include "net/job_token.h"
#include "net/throughput.h"
#include "tools/command.h"
#include "tools/json_output.h"

namespace memento::tools {
namespace {

struct Args {
  double bytes = 1e9;
  double chunk = 4 << 20;
  int repeat = 3;
  bool json = true;
};

Status Run(const Args& a) {
  if (a.bytes < 1 || a.chunk < 1 || a.repeat < 1) {
    return InvalidArgumentError("--bytes, --chunk and --repeat must be >= 1");
  }
  size_t bytes = static_cast<size_t>(a.bytes), chunk = static_cast<size_t>(a.chunk);
  MEMENTO_ASSIGN_OR_RETURN(net::JobToken token, net::JobToken::Generate());
  // Best of `repeat` runs each, interleaved, so both see the same machine load.
  net::ThroughputResult raw, framed, digest;
  for (int i = 0; i < a.repeat; ++i) {
    MEMENTO_ASSIGN_OR_RETURN(net::ThroughputResult r, net::MeasureRawTcp(bytes, chunk));
    MEMENTO_ASSIGN_OR_RETURN(net::ThroughputResult f, net::MeasureFramedTcp(bytes, chunk, token));
    MEMENTO_ASSIGN_OR_RETURN(net::ThroughputResult g,
                             net::MeasureFramedTcp(bytes, chunk, token, /*digest_frames=*/true));
    if (r.gbps > raw.gbps) raw = r;
    if (f.gbps > framed.gbps) framed = f;
    if (g.gbps > digest.gbps) digest = g;
  }
  auto cores = [](const net::ThroughputResult& t) {
    return t.seconds > 0 ? (t.sender_cpu_s + t.receiver_cpu_s) / t.seconds : 0.0;
  };
  nlohmann::json j;
  j["bench"] = "tcp";
  j["bytes"] = bytes;
  j["chunk_bytes"] = chunk;
  j["repeat"] = a.repeat;
  j["tcp_gbps"] = raw.gbps;
  j["tcp_seconds"] = raw.seconds;
  j["framed_gbps"] = framed.gbps;
  j["framed_seconds"] = framed.seconds;
  j["ratio"] = raw.gbps > 0 ? framed.gbps / raw.gbps : 0.0;
  // Digest frames with a digest the sender knows (a slot chunk's checksum):
  // the recovery data path's transport cost.
  j["digest_gbps"] = digest.gbps;
  j["digest_ratio"] = raw.gbps > 0 ? digest.gbps / raw.gbps : 0.0;
  j["tcp_cores"] = cores(raw);
  j["framed_cores"] = cores(framed);
  j["digest_cores"] = cores(digest);
  memento::tools::PrintJson("memento.bench.tcp/1", std::move(j));
  return Status::Ok();
}

void Setup(CLI::App& bench, CommandContext& ctx) {
  auto args = std::make_shared<Args>();
  auto* cmd = bench.add_subcommand(
      "tcp", "Loopback TCP throughput: raw sockets vs the framed, authenticated transport");
  cmd->add_option("--bytes", args->bytes, "bytes to send per run (default 1e9)")
      ->transform(ByteSize());
  cmd->add_option("--chunk", args->chunk, "send size / frame payload size (default 4 MiB)")
      ->transform(ByteSize());
  cmd->add_option("--repeat", args->repeat, "runs of each; the best is reported (default 3)");
  cmd->add_flag("--json", args->json, "print JSON (the only format; accepted for symmetry)");
  cmd->callback([args, &ctx] { ctx.exit_code = ReportStatus(Run(*args)); });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_BENCH(tcp, memento::tools::Setup);
