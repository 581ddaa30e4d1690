#include "common/tensor_json.h"

#include <gtest/gtest.h>

namespace memento {
namespace {

using nlohmann::json;

std::vector<TensorMeta> Sample() {
  TensorMeta a;
  a.name = "layer0.w";
  a.dtype = DType::kBFloat16;
  a.shape = {4, 2};
  a.state_class = StateClass::kReplicated;
  TensorMeta b;
  b.name = "adam.m";
  b.dtype = DType::kFloat32;
  b.shape = {8};
  b.state_class = StateClass::kDpSharded;
  b.global_numel = 32;
  b.shard_offset = 8;
  TensorMeta c;
  c.name = "rng";
  c.dtype = DType::kUInt8;
  c.shape = {};
  c.state_class = StateClass::kPrivate;
  return {a, b, c};
}

TEST(TensorJsonTest, RoundTripsEveryField) {
  for (const TensorMeta& m : Sample()) {
    Result<TensorMeta> back = TensorMetaFromJson(TensorMetaToJson(m));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, m) << m.name;
  }
  const std::vector<TensorMeta> list = Sample();
  Result<std::vector<TensorMeta>> back = ParseTensorList(TensorListToJson(list).dump());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, list);
  // The {"tensors": [...]} form as well.
  back = TensorListFromJson(json{{"tensors", TensorListToJson(list)}});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, list);
}

TEST(TensorJsonTest, ShardFieldsDefaultToZero) {
  auto m = TensorMetaFromJson(
      {{"name", "x"}, {"dtype", "F32"}, {"shape", {3}}, {"state_class", "private"}});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->global_numel, 0);
  EXPECT_EQ(m->shard_offset, 0);
}

void ExpectBad(const json& j, const std::string& names) {
  Result<TensorMeta> m = TensorMetaFromJson(j);
  ASSERT_FALSE(m.ok()) << j.dump();
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << j.dump();
  EXPECT_NE(m.status().message().find(names), std::string::npos)
      << "'" << m.status().message() << "' does not name '" << names << "'";
}

TEST(TensorJsonTest, MalformedDescriptionNamesTheProblem) {
  ExpectBad({{"dtype", "F32"}, {"shape", {1}}, {"state_class", "private"}}, "name");
  ExpectBad({{"name", "x"}, {"dtype", "F99"}, {"shape", {1}}, {"state_class", "private"}}, "F99");
  ExpectBad({{"name", "x"}, {"dtype", "F32"}, {"shape", "big"}, {"state_class", "private"}},
            "malformed tensor description");
  ExpectBad({{"name", "x"}, {"dtype", "F32"}, {"shape", {1}}, {"state_class", "shared"}}, "shared");
  ExpectBad(json::array(), "not a JSON object");
}

TEST(TensorJsonTest, MalformedListNamesTheEntry) {
  json list = TensorListToJson(Sample());
  list[1].erase("dtype");
  Result<std::vector<TensorMeta>> r = TensorListFromJson(list);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("entry 1"), std::string::npos) << r.status().message();
  EXPECT_EQ(TensorListFromJson(json::object()).status().code(), StatusCode::kInvalidArgument);
  r = ParseTensorList("[{\"name\":");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not JSON"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace memento
