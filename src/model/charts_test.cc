// The pictures parse as XML (expat) and hold the curves they should, with
// the right number of points.
#include "model/charts.h"

#include <expat.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include "model/layout_svg.h"
#include "recover/recover.h"

namespace memento::model {
namespace {

struct Parsed {
  bool ok = false;
  std::string error;
  std::string root;
  std::map<std::string, int> series_points;                 // data-name -> points
  std::vector<std::string> thresholds;                      // data-value
  std::map<int, bool> nodes;                                // data-node -> lost
  std::vector<std::string> groups;                          // data-nodes
  std::vector<std::tuple<int, int, std::string>> rebuilds;  // from, to, kind
};

Parsed ParseSvg(const std::string& text) {
  Parsed out;
  XML_Parser p = XML_ParserCreate("UTF-8");
  XML_SetUserData(p, &out);
  XML_SetStartElementHandler(p, [](void* data, const XML_Char* name, const XML_Char** attrs) {
    auto* o = static_cast<Parsed*>(data);
    if (o->root.empty()) o->root = name;
    std::map<std::string, std::string> a;
    for (int i = 0; attrs[i]; i += 2) a[attrs[i]] = attrs[i + 1];
    if (std::string(name) == "polyline" && a["class"] == "series") {
      std::istringstream pts(a["points"]);
      std::string xy;
      int n = 0;
      while (pts >> xy) {
        if (xy.find(',') == std::string::npos) return;  // malformed: counted as missing
        ++n;
      }
      o->series_points[a["data-name"]] = n;
    }
    if (std::string(name) == "line" && a["class"] == "threshold") {
      o->thresholds.push_back(a["data-value"]);
    }
    if (std::string(name) == "g" && a["class"].rfind("node", 0) == 0) {
      o->nodes[std::stoi(a["data-node"])] = a["class"] == "node lost";
    }
    if (std::string(name) == "g" && a["class"] == "group") o->groups.push_back(a["data-nodes"]);
    if (std::string(name) == "path" && a["class"] == "rebuild") {
      o->rebuilds.emplace_back(std::stoi(a["data-from"]), std::stoi(a["data-to"]), a["data-kind"]);
    }
  });
  out.ok = XML_Parse(p, text.data(), static_cast<int>(text.size()), 1) == XML_STATUS_OK;
  if (!out.ok) out.error = XML_ErrorString(XML_GetErrorCode(p));
  XML_ParserFree(p);
  return out;
}

TEST(ChartsTest, SurvivalChartHasOneCurvePerPolicyAndTheThreshold) {
  std::vector<Structure> structures;
  for (const char* p : {"durable", "none", "xor", "rs:2", "replicate"}) {
    auto s = UniformStructure(p, 3072, 6, 0);
    ASSERT_TRUE(s.ok());
    structures.push_back(*s);
  }
  FailureRates rates;
  rates.hardware = {1e-4, 1.3};
  rates.software = {1e-5, 1.3};
  auto chart = SurvivalChart(structures, rates, 0.9, 30, 121, "day");
  ASSERT_TRUE(chart.ok()) << chart.status();
  const std::string svg = RenderSvg(*chart);
  const Parsed parsed = ParseSvg(svg);
  ASSERT_TRUE(parsed.ok) << parsed.error;
  EXPECT_EQ(parsed.root, "svg");
  ASSERT_EQ(parsed.series_points.size(), 5u);
  for (const char* p : {"durable", "none", "xor", "rs:2", "replicate"}) {
    EXPECT_EQ(parsed.series_points.at(p), 121) << p;
  }
  ASSERT_EQ(parsed.thresholds.size(), 1u);
  EXPECT_EQ(parsed.thresholds[0], "0.9");
  // The survival curve starts at 1 and falls (first point at the top of the
  // plot area, last one lower).
  EXPECT_EQ(chart->series[2].points.front().second, 1.0);
  EXPECT_LT(chart->series[2].points.back().second, 0.9);
}

TEST(ChartsTest, GoodputChartHasEveryPolicyCurve) {
  std::vector<Structure> structures;
  for (const char* p : {"durable", "xor", "replicate"}) {
    auto s = UniformStructure(p, 64, 8, 0);
    ASSERT_TRUE(s.ok());
    structures.push_back(*s);
  }
  FailureRates rates;
  rates.hardware = {1e-3, 1.0};
  rates.software = {1e-3, 1.0};
  ClusterFigures f;
  auto rec = Recommend(structures, rates, 86400, 0.9, f, 50);
  ASSERT_TRUE(rec.ok()) << rec.status();
  const Parsed parsed = ParseSvg(RenderSvg(GoodputChart(*rec)));
  ASSERT_TRUE(parsed.ok) << parsed.error;
  ASSERT_EQ(parsed.series_points.size(), 3u);
  for (const auto& [name, n] : parsed.series_points) EXPECT_EQ(n, 50) << name;
  EXPECT_EQ(parsed.thresholds.size(), 1u);  // the Young/Daly baseline
}

// Labels are escaped: a policy name with markup still parses.
TEST(ChartsTest, LabelsAreEscaped) {
  Chart c;
  c.title = "a < b & \"c\"";
  c.series.push_back({"<x>", {{1, 1}, {2, 2}}});
  const Parsed parsed = ParseSvg(RenderSvg(c));
  ASSERT_TRUE(parsed.ok) << parsed.error;
  EXPECT_EQ(parsed.series_points.at("<x>"), 2);
}

// The placement picture: every node once, lost ones marked, one row per
// sharding group, and an arrow from every survivor the recovery reads to the
// lost node (xor: decode inputs from the lost node's group; AOR: a copy).
TEST(ChartsTest, LayoutPictureShowsNodesGroupsAndRebuilds) {
  auto t = topo::Topology::Uniform(4, 1, 2, 1, 1);  // 8 nodes, groups {0..3} {4..7}
  ASSERT_TRUE(t.ok());
  t->node_rack = {"r0", "r1", "r0", "r1", "r0", "r1", "r0", "r1"};
  topo::Inventory inv(t->num_ranks());
  for (auto& r : inv) {
    TensorMeta m;
    m.name = "params";
    m.dtype = DType::kFloat32;
    m.shape = {4096};
    m.state_class = StateClass::kReplicated;
    r.push_back(m);
    m.name = "opt";
    m.state_class = StateClass::kDpSharded;
    r.push_back(m);
  }
  auto pol = topo::ParsePolicy("xor");
  ASSERT_TRUE(pol.ok());
  auto plan = topo::MakePlan(*t, inv, *pol);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto rec = recover::PlanFailure(*plan, {5});
  ASSERT_TRUE(rec.ok());
  ASSERT_TRUE(rec->recoverable);
  const Parsed parsed = ParseSvg(RenderLayoutSvg(*plan, &*rec));
  ASSERT_TRUE(parsed.ok) << parsed.error;
  ASSERT_EQ(parsed.nodes.size(), 8u);
  for (const auto& [n, lost] : parsed.nodes) EXPECT_EQ(lost, n == 5) << n;
  ASSERT_EQ(parsed.groups.size(), 2u);
  std::set<std::string> kinds;
  std::set<int> sources;
  for (const auto& [from, to, kind] : parsed.rebuilds) {
    EXPECT_EQ(to, 5);
    EXPECT_NE(from, 5);
    EXPECT_GE(from, 4);  // same sharding group
    kinds.insert(kind);
    sources.insert(from);
  }
  EXPECT_TRUE(kinds.count("decode"));
  EXPECT_TRUE(kinds.count("copy"));  // the AOR copy of node 5's optimizer shard
  EXPECT_EQ(sources.size(), 3u);     // every survivor of the group contributes
  // Without a failure set: no lost node, no arrows.
  const Parsed plain = ParseSvg(RenderLayoutSvg(*plan, nullptr));
  ASSERT_TRUE(plain.ok);
  EXPECT_EQ(plain.rebuilds.size(), 0u);
  for (const auto& [n, lost] : plain.nodes) EXPECT_FALSE(lost);
}

}  // namespace
}  // namespace memento::model
