#include "shm/agent_messages.h"

#include <gtest/gtest.h>

#include <cmath>

#include "shm/protocol.h"
#include "shm/slot_limits.h"

namespace memento::shm {
namespace {

TEST(AgentRequestTest, ParsesEveryOpTheClientSends) {
  auto hello = ParseAgentRequest(R"({"op":"hello","protocol":1,"job":"j","rank":3,"pid":9})");
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(hello->op, AgentOp::kHello);
  EXPECT_EQ(hello->protocol, 1u);
  EXPECT_EQ(hello->job, "j");
  EXPECT_EQ(hello->rank, 3);
  auto seal = ParseAgentRequest(R"({"op":"seal","rank":0,"bytes":8192,"manifest":"[]"})");
  ASSERT_TRUE(seal.ok()) << seal.status();
  EXPECT_EQ(seal->bytes, 8192u);
  EXPECT_TRUE(seal->has_manifest);
  EXPECT_EQ(seal->manifest, "[]");
  auto bare = ParseAgentRequest(R"({"op":"seal","rank":0,"bytes":4096})");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_FALSE(bare->has_manifest);
  auto complete = ParseAgentRequest(R"({"op":"complete","rank":2,"slot":1,"step":40})");
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_EQ(complete->slot, 1);
  EXPECT_EQ(complete->step, 40);
  EXPECT_TRUE(ParseAgentRequest(R"({"op":"skipped","rank":2,"step":0})").ok());
  EXPECT_TRUE(ParseAgentRequest(R"({"op":"target","rank":2})").ok());
  EXPECT_TRUE(ParseAgentRequest(R"({"op":"verify","rank":2,"slot":0})").ok());
  EXPECT_TRUE(ParseAgentRequest(R"({"op":"list","rank":2})").ok());
  auto plan = ParseAgentRequest(R"({"op":"plan","rank":2})");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->op, AgentOp::kPlan);
  EXPECT_EQ(plan->rank, 2);
  EXPECT_EQ(ParseAgentRequest(R"({"op":"plan","rank":-1})").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseAgentRequest(R"({"op":"plan"})").status().code(), StatusCode::kInvalidArgument);
  // "parities": the client computes its rank's parities (docs/reft.md s4);
  // older clients send no field.
  EXPECT_FALSE(plan->client_parity);
  auto with_parity = ParseAgentRequest(AgentRequestToJson(PlanRequest(2, true)).dump());
  ASSERT_TRUE(with_parity.ok()) << with_parity.status();
  EXPECT_TRUE(with_parity->client_parity);
  EXPECT_EQ(AgentRequestToJson(PlanRequest(2)).dump().find("parities"), std::string::npos);
  Status bad_flag = ParseAgentRequest(R"({"op":"plan","rank":2,"parities":1})").status();
  EXPECT_EQ(bad_flag.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_flag.message().find("'parities'"), std::string::npos) << bad_flag;
  // "step" (optional): the snapshot the answer lays out.
  EXPECT_EQ(plan->step, -1);
  auto with_step = ParseAgentRequest(AgentRequestToJson(PlanRequest(2, true, 17)).dump());
  ASSERT_TRUE(with_step.ok()) << with_step.status();
  EXPECT_EQ(with_step->step, 17);
  EXPECT_EQ(AgentRequestToJson(PlanRequest(2, true)).dump().find("step"), std::string::npos);
  Status bad_step = ParseAgentRequest(R"({"op":"plan","rank":2,"step":-3})").status();
  EXPECT_EQ(bad_step.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_step.message().find("'step'"), std::string::npos) << bad_step;
  EXPECT_TRUE(ParseAgentRequest(R"({"op":"ping"})").ok());
  auto top = ParseAgentRequest(R"({"op":"seal","rank":1073741823,"bytes":281474976710656})");
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(top->rank, kMaxRank);
  EXPECT_EQ(top->bytes, kMaxSlotBytes);
}

TEST(AgentRequestTest, ErrorsNameTheFieldAndTheValue) {
  auto r = ParseAgentRequest(R"({"op":"seal","rank":0,"bytes":1e30})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'bytes'"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("1e+30"), std::string::npos) << r.status();
  r = ParseAgentRequest(R"({"op":"seal","rank":0,"bytes":281474976710657})");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  r = ParseAgentRequest(R"({"op":"seal","rank":1073741824,"bytes":8192})");
  EXPECT_NE(r.status().message().find("'rank'"), std::string::npos) << r.status();
  // Strings inside the message may hold brackets without counting as depth.
  std::string deep_string = R"({"op":"ping","x":")" + std::string(1000, '[') + R"("})";
  EXPECT_TRUE(ParseAgentRequest(deep_string).ok());
  std::string deep = R"({"op":"ping","x":)" + std::string(20, '[') + std::string(20, ']') + "}";
  EXPECT_EQ(ParseAgentRequest(deep).status().code(), StatusCode::kInvalidArgument);
}

// Every request the client builds comes back from the agent's parser as it
// was built, through the bytes that cross the socket.
TEST(AgentRequestTest, EveryRequestRoundTripsThroughTheWire) {
  const std::string encoding = {'\x00', '\xff', 'a', 'b'};  // an optimizer's, with a NUL
  const std::vector<AgentRequest> requests = {HelloRequest("job-1", 7, 16),
                                              SealRequest(3, 1 << 20, "[]"),
                                              CompleteRequest(2, 1, 41),
                                              SkippedRequest(2, 0),
                                              TargetRequest(5),
                                              VerifyRequest(5, 0),
                                              ListRequest(kMaxRank),
                                              AssembleRequest(3, 17),
                                              PlanRequest(4),
                                              AorRegisterRequest(2, encoding, 99),
                                              AorCaptureRequest(2, 5, 1.5e-4f),
                                              AorCaptureRequest(2, 6, std::nanf("")),
                                              AorChecksumRequest(2, 5, ~uint64_t{0}),
                                              AgentRequest{}};
  for (const AgentRequest& sent : requests) {
    auto got = ParseAgentRequest(AgentRequestToJson(sent).dump());
    ASSERT_TRUE(got.ok()) << AgentOpName(sent.op) << ": " << got.status();
    EXPECT_EQ(got->op, sent.op);
    EXPECT_EQ(got->protocol, sent.protocol);
    EXPECT_EQ(got->job, sent.job);
    EXPECT_EQ(got->world_size, sent.world_size);
    EXPECT_EQ(got->rank, sent.rank);
    EXPECT_EQ(got->bytes, sent.bytes);
    EXPECT_EQ(got->has_manifest, sent.has_manifest);
    EXPECT_EQ(got->manifest, sent.manifest);
    EXPECT_EQ(got->slot, sent.slot);
    EXPECT_EQ(got->step, sent.step);
    EXPECT_EQ(got->optimizer, sent.optimizer);
    EXPECT_EQ(got->numel, sent.numel);
    EXPECT_EQ(got->has_lr, sent.has_lr);
    EXPECT_EQ(got->lr, sent.lr);
    EXPECT_EQ(got->checksum, sent.checksum);
  }
  EXPECT_EQ(HelloRequest("j", 0, 1).protocol, kProtocolVersion);
  EXPECT_EQ(OptimizerEncoding(AorRegisterRequest(0, encoding, 1)), encoding);
  EXPECT_EQ(static_cast<float>(AorCaptureRequest(0, 1, 1.5e-4f).lr), 1.5e-4f);
}

// AOR requests (docs/reft.md section 5): each malformed field is named.
TEST(AgentRequestTest, MalformedAorRequestsNameTheField) {
  auto field = [](const char* body, const char* name) {
    auto r = ParseAgentRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(name), std::string::npos) << r.status();
  };
  field(R"({"op":"aor_register","rank":0,"numel":4})", "'optimizer'");
  field(R"({"op":"aor_register","rank":0,"optimizer":"","numel":4})", "'optimizer'");
  field(R"({"op":"aor_register","rank":0,"optimizer":"abc","numel":4})", "'optimizer'");
  field(R"({"op":"aor_register","rank":0,"optimizer":"ABCD","numel":4})", "'optimizer'");
  field(R"({"op":"aor_register","rank":0,"optimizer":"zz","numel":4})", "'optimizer'");
  field(R"({"op":"aor_register","rank":0,"optimizer":"00","numel":0})", "'numel'");
  field(R"({"op":"aor_register","rank":0,"optimizer":"00","numel":-3})", "'numel'");
  field(R"({"op":"aor_capture","rank":0})", "'step'");
  field(R"({"op":"aor_capture","rank":0,"step":0})", "'step'");
  field(R"({"op":"aor_capture","rank":0,"step":1,"lr":"0.1"})", "'lr'");
  field(R"({"op":"aor_capture","rank":0,"step":1,"lr":1e300})", "'lr'");
  field(R"({"op":"aor_checksum","rank":0,"step":1})", "'checksum'");
  field(R"({"op":"aor_checksum","rank":0,"step":1,"checksum":-1})", "'checksum'");
  auto ok = ParseAgentRequest(R"({"op":"aor_register","rank":1,"optimizer":"0aff","numel":4})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(OptimizerEncoding(*ok), std::string("\x0a\xff", 2));
  auto schedule = ParseAgentRequest(R"({"op":"aor_capture","rank":1,"step":3})");
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_FALSE(schedule->has_lr);
}

TEST(AgentRequestTest, ABadWorldSizeInHelloIsNamed) {
  auto r = ParseAgentRequest(R"({"op":"hello","protocol":1,"job":"j","rank":0,"world_size":0})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'world_size'"), std::string::npos) << r.status();
}

// Every reply the agent writes comes back from the client's parser as it
// was written, through the bytes that cross the socket.
TEST(AgentReplyTest, EveryReplyRoundTripsThroughTheWire) {
  auto wire = [](const nlohmann::json& j) { return nlohmann::json::parse(j.dump()); };
  auto hello = ParseHelloReply(wire(ToJson(HelloReply{3, "/dev/shm/memento/j/node3", 4242})));
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(hello->node, 3);
  EXPECT_EQ(hello->root, "/dev/shm/memento/j/node3");
  EXPECT_EQ(hello->pid, 4242);

  auto seal = ParseSealReply(wire(ToJson(SealReply{{"/a/rank0.slot0", "/a/rank0.slot1"}})));
  ASSERT_TRUE(seal.ok()) << seal.status();
  EXPECT_EQ(seal->paths, (std::vector<std::string>{"/a/rank0.slot0", "/a/rank0.slot1"}));

  for (int64_t step : {int64_t{-1}, int64_t{0}, int64_t{1} << 40}) {
    auto target = ParseTargetReply(wire(ToJson(TargetReply{step})));
    ASSERT_TRUE(target.ok()) << target.status();
    EXPECT_EQ(target->step, step);
  }

  auto ok = ParseVerifyReply(wire(ToJson(VerifyReply{Status::Ok()})));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->slot_status.ok());
  auto bad = ParseVerifyReply(wire(ToJson(VerifyReply{DataLossError("chunk 3 fails")})));
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(bad->slot_status.code(), StatusCode::kDataLoss);
  EXPECT_NE(bad->slot_status.message().find("chunk 3 fails"), std::string::npos);

  ListReply list;
  list.versions.push_back({12, 1, true, 1 << 20, ""});
  list.versions.push_back({11, 0, false, 4096, "chunk 0 fails its checksum"});
  auto got = ParseListReply(wire(ToJson(list)));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->versions.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(got->versions[i].step, list.versions[i].step);
    EXPECT_EQ(got->versions[i].slot, list.versions[i].slot);
    EXPECT_EQ(got->versions[i].intact, list.versions[i].intact);
    EXPECT_EQ(got->versions[i].bytes, list.versions[i].bytes);
    EXPECT_EQ(got->versions[i].error, list.versions[i].error);
  }
  EXPECT_TRUE(ParseListReply(wire(ToJson(ListReply{}))).value().versions.empty());

  auto assembled = ParseAssembleReply(wire(ToJson(AssembleReply{"/r/assembled.rank3", 4096})));
  ASSERT_TRUE(assembled.ok()) << assembled.status();
  EXPECT_EQ(assembled->path, "/r/assembled.rank3");
  EXPECT_EQ(assembled->bytes, 4096u);

  PlanReply plan;
  plan.plan_hash = "00ff00ff00ff00ff";
  plan.sharded = true;
  plan.ranges = {{"w", 0, 4096}, {"w", 8192, 64}, {"empty", 0, 0}, {"rng", 0, 13}};
  auto p = ParsePlanReply(wire(ToJson(plan)));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->plan_hash, plan.plan_hash);
  EXPECT_TRUE(p->sharded);
  ASSERT_EQ(p->ranges.size(), plan.ranges.size());
  for (size_t i = 0; i < plan.ranges.size(); ++i) {
    EXPECT_EQ(p->ranges[i].tensor, plan.ranges[i].tensor);
    EXPECT_EQ(p->ranges[i].offset, plan.ranges[i].offset);
    EXPECT_EQ(p->ranges[i].length, plan.ranges[i].length);
  }
  auto whole = ParsePlanReply(wire(ToJson(PlanReply{})));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_FALSE(whole->sharded);
  EXPECT_TRUE(whole->ranges.empty());
  EXPECT_TRUE(whole->parities.empty());
  EXPECT_TRUE(p->parities.empty());  // "parities" absent: none (older agents)

  // Parities the client computes: code, k, f, index, block size, blocks.
  PlanParity xp;
  xp.id = 7;
  xp.xor_code = true;
  xp.k = 3;
  xp.f = 1;
  xp.block_bytes = 4096;
  xp.blocks = {{{"w", 4096, 4000}, {"b", 0, 96}}, {{"w", 0, 64}}, {}};
  PlanParity rp = xp;
  rp.id = 9;
  rp.xor_code = false;
  rp.f = 2;
  rp.k = 2;
  rp.index = 1;
  rp.blocks = {{{"w", 64, 4096}}, {{"w", 8192, 100}}};
  plan.parities = {xp, rp};
  auto pp = ParsePlanReply(wire(ToJson(plan)));
  ASSERT_TRUE(pp.ok()) << pp.status();
  ASSERT_EQ(pp->parities.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const PlanParity& want = plan.parities[i];
    const PlanParity& got = pp->parities[i];
    EXPECT_EQ(got.id, want.id);
    EXPECT_EQ(got.xor_code, want.xor_code);
    EXPECT_EQ(got.k, want.k);
    EXPECT_EQ(got.f, want.f);
    EXPECT_EQ(got.index, want.index);
    EXPECT_EQ(got.block_bytes, want.block_bytes);
    ASSERT_EQ(got.blocks.size(), want.blocks.size());
    for (size_t b = 0; b < want.blocks.size(); ++b) {
      ASSERT_EQ(got.blocks[b].size(), want.blocks[b].size());
      for (size_t r = 0; r < want.blocks[b].size(); ++r) {
        EXPECT_EQ(got.blocks[b][r].tensor, want.blocks[b][r].tensor);
        EXPECT_EQ(got.blocks[b][r].offset, want.blocks[b][r].offset);
        EXPECT_EQ(got.blocks[b][r].length, want.blocks[b][r].length);
      }
    }
  }

  AorRegisterReply aor;
  aor.path = "/r/aor_stage.3";
  aor.ranges = {{1, 500, 500}, {5, 0, 7}};
  auto a = ParseAorRegisterReply(wire(ToJson(aor)));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->path, aor.path);
  ASSERT_EQ(a->ranges.size(), 2u);
  EXPECT_EQ(a->ranges[1].owner, 5);
  EXPECT_EQ(a->ranges[1].count, 7u);
  auto none = ParseAorRegisterReply(wire(ToJson(AorRegisterReply{})));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->ranges.empty());
  // Ranges without a staging file, an empty range.
  nlohmann::json bad_aor = ToJson(aor);
  bad_aor["path"] = "";
  EXPECT_NE(ParseAorRegisterReply(bad_aor).status().message().find("'path'"), std::string::npos);
  bad_aor = ToJson(aor);
  bad_aor["ranges"][0]["count"] = 0;
  EXPECT_NE(ParseAorRegisterReply(bad_aor).status().message().find("'count'"), std::string::npos);
}

TEST(AgentRequestTest, AssembleNeedsAStep) {
  for (const char* body :
       {R"({"op":"assemble","rank":1})", R"({"op":"assemble","rank":1,"step":-1})",
        R"({"op":"assemble","rank":1,"step":"3"})"}) {
    auto r = ParseAgentRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << body;
    EXPECT_NE(r.status().message().find("'assemble' request"), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("'step'"), std::string::npos) << r.status();
  }
}

// A malformed reply is InvalidArgument naming the op and the field, never an
// exception or a half-filled struct.
TEST(AgentReplyTest, MalformedRepliesNameTheOpAndTheField) {
  struct Case {
    const char* json;
    const char* op;     // which parser
    const char* field;  // what the message must name
  };
  const Case cases[] = {
      {R"({"ok":true})", "seal", "'paths'"},
      {R"({"ok":true,"paths":"/a"})", "seal", "'paths'"},
      {R"({"ok":true,"paths":["/a"]})", "seal", "'paths'"},
      {R"({"ok":true,"paths":["/a","/b","/c"]})", "seal", "'paths'"},
      {R"({"ok":true,"paths":["/a",7]})", "seal", "'paths'"},
      {R"({"ok":true,"paths":["/a",""]})", "seal", "'paths'"},
      {R"({"ok":true})", "target", "'step'"},
      {R"({"ok":true,"step":"4"})", "target", "'step'"},
      {R"({"ok":true,"step":-2})", "target", "'step'"},
      {R"({"ok":true,"step":1.5})", "target", "'step'"},
      {R"({"ok":true,"slot_status":true})", "verify", "'slot_status'"},
      {R"({"ok":true})", "list", "'versions'"},
      {R"({"ok":true,"versions":{}})", "list", "'versions'"},
      {R"({"ok":true,"versions":[1]})", "list", "'versions'"},
      {R"({"ok":true,"versions":[{},{},{}]})", "list", "'versions'"},
      {R"({"ok":true,"versions":[{"step":1,"slot":2,"intact":true,"bytes":1,"error":""}]})", "list",
       "'slot'"},
      {R"({"ok":true,"versions":[{"step":1,"slot":0,"intact":1,"bytes":1,"error":""}]})", "list",
       "'intact'"},
      {R"({"ok":true,"versions":[{"step":1,"slot":0,"intact":true,"bytes":-1,"error":""}]})",
       "list", "'bytes'"},
      {R"({"ok":true,"versions":[{"step":1,"slot":0,"intact":true,"bytes":1}]})", "list",
       "'error'"},
      {R"({"ok":true,"node":0,"root":"/r","pid":0})", "hello", "'pid'"},
      {R"({"ok":true,"node":-1,"root":"/r","pid":5})", "hello", "'node'"},
      {R"([1,2])", "hello", "'node'"},
      {R"({"ok":true,"bytes":1})", "assemble", "'path'"},
      {R"({"ok":true,"path":"","bytes":1})", "assemble", "'path'"},
      {R"({"ok":true,"path":"/p","bytes":-1})", "assemble", "'bytes'"},
      {R"({"ok":true,"path":"/p"})", "assemble", "'bytes'"},
      {R"({"ok":true,"sharded":true,"ranges":[]})", "plan", "'plan_hash'"},
      {R"({"ok":true,"plan_hash":"","ranges":[]})", "plan", "'sharded'"},
      {R"({"ok":true,"plan_hash":"","sharded":"yes","ranges":[]})", "plan", "'sharded'"},
      {R"({"ok":true,"plan_hash":"","sharded":true})", "plan", "'ranges'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":{}})", "plan", "'ranges'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[7]})", "plan", "'ranges'"},
      {R"({"ok":true,"plan_hash":"","sharded":false,"ranges":[{"tensor":"w","offset":0,"length":4}]})",
       "plan", "'ranges'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[{"offset":0,"length":4}]})", "plan",
       "'tensor'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[{"tensor":"","offset":0,"length":4}]})",
       "plan", "'tensor'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[{"tensor":"w","offset":-64,"length":4}]})",
       "plan", "'offset'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[{"tensor":"w","offset":64,"length":0}]})",
       "plan", "'length'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[{"tensor":"w","offset":64,"length":18446744073709551615}]})",
       "plan", "'length'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[{"tensor":"w","offset":0,"length":1.5}]})",
       "plan", "'length'"},
      {R"({"ok":true,"plan_hash":"","sharded":false,"ranges":[],"parities":[{"id":1,"code":"xor","k":2,"f":1,"index":0,"block_bytes":64,"blocks":[[],[]]}]})",
       "plan", "'parities'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":{}})", "plan",
       "'parities'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[7]})", "plan",
       "'parities'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"code":"xor","k":2,"f":1,"index":0,"block_bytes":64,"blocks":[[],[]]}]})",
       "plan", "'id'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"lrc","k":2,"f":1,"index":0,"block_bytes":64,"blocks":[[],[]]}]})",
       "plan", "'code'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"xor","k":0,"f":1,"index":0,"block_bytes":64,"blocks":[]}]})",
       "plan", "'k'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"xor","k":2,"f":2,"index":0,"block_bytes":64,"blocks":[[],[]]}]})",
       "plan", "'f'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"rs","k":200,"f":60,"index":0,"block_bytes":64,"blocks":[]}]})",
       "plan", "'f'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"rs","k":2,"f":2,"index":2,"block_bytes":64,"blocks":[[],[]]}]})",
       "plan", "'index'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"xor","k":2,"f":1,"index":0,"block_bytes":-1,"blocks":[[],[]]}]})",
       "plan", "'block_bytes'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"xor","k":2,"f":1,"index":0,"block_bytes":64,"blocks":[[]]}]})",
       "plan", "'blocks'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"xor","k":2,"f":1,"index":0,"block_bytes":64,"blocks":[[],7]}]})",
       "plan", "'blocks'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"xor","k":2,"f":1,"index":0,"block_bytes":64,"blocks":[[],[7]]}]})",
       "plan", "'blocks'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"xor","k":2,"f":1,"index":0,"block_bytes":64,"blocks":[[],[{"tensor":"w","offset":0,"length":65}]]}]})",
       "plan", "'blocks'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"xor","k":2,"f":1,"index":0,"block_bytes":64,"blocks":[[{"tensor":"w","offset":0,"length":40},{"tensor":"w","offset":64,"length":40}],[]]}]})",
       "plan", "'blocks'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"xor","k":2,"f":1,"index":0,"block_bytes":64,"blocks":[[{"tensor":"","offset":0,"length":4}],[]]}]})",
       "plan", "'tensor'"},
      {R"({"ok":true,"plan_hash":"","sharded":true,"ranges":[],"parities":[{"id":1,"code":"xor","k":2,"f":1,"index":0,"block_bytes":64,"blocks":[[],[]]},{"id":1,"code":"xor","k":2,"f":1,"index":0,"block_bytes":64,"blocks":[[],[]]}]})",
       "plan", "'parities'"},
  };
  for (const Case& c : cases) {
    const nlohmann::json j = nlohmann::json::parse(c.json);
    Status st;
    const std::string op = c.op;
    if (op == "seal") st = ParseSealReply(j).status();
    if (op == "target") st = ParseTargetReply(j).status();
    if (op == "verify") st = ParseVerifyReply(j).status();
    if (op == "list") st = ParseListReply(j).status();
    if (op == "hello") st = ParseHelloReply(j).status();
    if (op == "assemble") st = ParseAssembleReply(j).status();
    if (op == "plan") st = ParsePlanReply(j).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.json << ": " << st;
    EXPECT_NE(st.message().find("'" + op + "' reply"), std::string::npos) << c.json << ": " << st;
    EXPECT_NE(st.message().find(c.field), std::string::npos) << c.json << ": " << st;
  }
}

}  // namespace
}  // namespace memento::shm
