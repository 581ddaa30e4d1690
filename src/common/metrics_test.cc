#include "common/metrics.h"

#include <gtest/gtest.h>

namespace memento {
namespace {

TEST(MetricsTextTest, WritesHelpTypeAndSamplesInExpositionFormat) {
  MetricsText m;
  m.Counter("memento_snapshots_total", "Snapshots completed", 12);
  m.Gauge("memento_rank_step", "Newest step", 7, {{"rank", "0"}});
  m.Gauge("memento_rank_step", "Newest step", 8, {{"rank", "1"}});
  m.Gauge("memento_seconds", "A fraction", 0.25);
  m.Gauge("memento_odd", "Label escaping", 1, {{"why", "a \"b\"\\c\nd"}});
  EXPECT_EQ(m.str(),
            "# HELP memento_snapshots_total Snapshots completed\n"
            "# TYPE memento_snapshots_total counter\n"
            "memento_snapshots_total 12\n"
            "# HELP memento_rank_step Newest step\n"
            "# TYPE memento_rank_step gauge\n"
            "memento_rank_step{rank=\"0\"} 7\n"
            "memento_rank_step{rank=\"1\"} 8\n"
            "# HELP memento_seconds A fraction\n"
            "# TYPE memento_seconds gauge\n"
            "memento_seconds 0.25\n"
            "# HELP memento_odd Label escaping\n"
            "# TYPE memento_odd gauge\n"
            "memento_odd{why=\"a \\\"b\\\"\\\\c\\nd\"} 1\n");
  double v = 0;
  EXPECT_TRUE(FindMetric(m.str(), "memento_snapshots_total", "", &v));
  EXPECT_EQ(v, 12);
  EXPECT_TRUE(FindMetric(m.str(), "memento_rank_step", "rank=\"1\"", &v));
  EXPECT_EQ(v, 8);
  EXPECT_TRUE(FindMetric(m.str(), "memento_seconds", "", &v));
  EXPECT_EQ(v, 0.25);
  EXPECT_FALSE(FindMetric(m.str(), "memento_rank_step", "", &v));
  EXPECT_FALSE(FindMetric(m.str(), "memento_absent", "", &v));
}

TEST(MetricsTextTest, LargeCountsAreExact) {
  MetricsText m;
  m.Counter("memento_bytes_total", "Bytes", 1099511627776.0 + 3);
  EXPECT_NE(m.str().find("memento_bytes_total 1099511627779\n"), std::string::npos) << m.str();
}

TEST(MetricsTextDeathTest, ANameSplitAcrossTheTextIsABug) {
  MetricsText m;
  m.Gauge("memento_a", "a", 1);
  m.Gauge("memento_b", "b", 1);
  EXPECT_DEATH(m.Gauge("memento_a", "a", 2), "");
  EXPECT_DEATH(m.Gauge("bad name", "x", 2), "");
}

}  // namespace
}  // namespace memento
