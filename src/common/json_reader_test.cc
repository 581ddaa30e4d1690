#include "common/json_reader.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace memento {
namespace {

using nlohmann::json;

TEST(JsonReaderTest, ReadsFieldsOfTheRightType) {
  const json j = json::parse(
      R"({"n": 3, "u": 4000000000, "s": "x", "b": true, "d": 1.5, "v": [1, 2], "o": {"k": -1}})");
  JsonReader r("doc");
  int n = 0;
  uint32_t u = 0;
  std::string s;
  bool b = false;
  double d = 0;
  std::vector<int> v;
  int k = 0;
  EXPECT_TRUE(r.Get(j, "n", &n));
  EXPECT_TRUE(r.Get(j, "u", &u));
  EXPECT_TRUE(r.Get(j, "s", &s));
  EXPECT_TRUE(r.Get(j, "b", &b));
  EXPECT_TRUE(r.Get(j, "d", &d));
  EXPECT_TRUE(r.Get(j, "v", &v));
  EXPECT_TRUE(r.Get(r.Object(j, "o"), "k", &k));
  int absent = 7;
  EXPECT_TRUE(r.GetOptional(j, "absent", &absent));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(n, 3);
  EXPECT_EQ(u, 4000000000u);
  EXPECT_EQ(s, "x");
  EXPECT_TRUE(b);
  EXPECT_EQ(d, 1.5);
  EXPECT_EQ(v, (std::vector<int>{1, 2}));
  EXPECT_EQ(k, -1);
  EXPECT_EQ(absent, 7);
}

// Each kind of bad field is InvalidArgument naming the document, where and
// the field; the destination is left as it was and nothing throws.
TEST(JsonReaderTest, BadFieldsAreInvalidArgumentNamingTheField) {
  struct Case {
    const char* doc;
    const char* want;
  };
  for (const Case& c : std::vector<Case>{
           {R"({})", "'x' is missing"},
           {R"({"x": "3"})", "'x' is \"3\", not an integer"},
           {R"({"x": 1.0e30})", "not an integer"},
           {R"({"x": 3000000000})", "not an integer that fits"},
           {R"({"x": -1})", ""},  // fits int: no problem
           {R"([1])", "its parent is not an object"},
       }) {
    const json j = json::parse(c.doc);
    JsonReader r("doc");
    r.SetContext("pieces[2]");
    int x = 42;
    r.Get(j, "x", &x);
    if (*c.want == '\0') {
      EXPECT_TRUE(r.ok()) << c.doc << ": " << r.status();
      continue;
    }
    ASSERT_FALSE(r.ok()) << c.doc;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status();
    EXPECT_EQ(r.status().message().rfind("doc: pieces[2]: ", 0), 0u) << r.status();
    EXPECT_EQ(x, 42) << c.doc;
  }
  JsonReader r("doc");
  uint32_t u = 5;
  r.Get(json::parse(R"({"u": -1})"), "u", &u);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(u, 5u);
  JsonReader a("doc");
  std::vector<int> v;
  a.Get(json::parse(R"({"v": [1, "two"]})"), "v", &v);
  EXPECT_FALSE(a.ok());
  EXPECT_TRUE(v.empty());
  // A missing array reads as empty and is recorded; the first problem stays.
  JsonReader m("doc");
  EXPECT_TRUE(m.Array(json::object(), "pieces").empty());
  m.Fail("a later problem");
  EXPECT_NE(m.status().message().find("'pieces' is missing"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace memento
