#include "model/charts.h"

#include <cmath>
#include <cstdio>

namespace memento::model {

Result<Chart> SurvivalChart(const std::vector<Structure>& structures, const FailureRates& rates,
                            double threshold, double horizon, int points, const std::string& unit) {
  if (points < 2)
    return InvalidArgumentError("--svg-points " + std::to_string(points) + ": expected >= 2");
  if (!(horizon > 0)) {
    return InvalidArgumentError("--horizon " + std::to_string(horizon) + ": expected > 0");
  }
  Chart c;
  char title[160];
  std::snprintf(title, sizeof title,
                "Survival of in-memory state (Weibull c=%g, hw %g, sw %g, rack %g per %s)",
                rates.hardware.shape, rates.hardware.rate, rates.software.rate, rates.rack.rate,
                unit.c_str());
  c.title = title;
  c.x_label = "time since the last durable version (" + unit + "s)";
  c.y_label = "survival probability";
  c.fix_y = true;
  c.y_min = 0;
  c.y_max = 1;
  c.hlines.emplace_back(threshold, "threshold " + std::to_string(threshold).substr(0, 5));
  for (const auto& s : structures) {
    ChartSeries series;
    series.name = s.policy;
    for (int i = 0; i < points; ++i) {
      const double t = horizon * i / (points - 1);
      MEMENTO_ASSIGN_OR_RETURN(double v, Survival(s, rates, t));
      series.points.emplace_back(t, v);
    }
    c.series.push_back(std::move(series));
  }
  return c;
}

Chart GoodputChart(const Recommendation& rec) {
  Chart c;
  c.title = "Goodput against the durable interval (first-order model)";
  c.x_label = "interval between durable versions (hours, log scale)";
  c.y_label = "goodput (useful / wall time)";
  c.log_x = true;
  double lo = 1;
  for (const auto& e : rec.ranked) {
    ChartSeries s;
    s.name = e.policy + (e.cost.fits ? "" : " (over budget)");
    for (auto [interval, g] : e.curve) {
      s.points.emplace_back(interval / 3600, g);
      if (g > 0) lo = std::min(lo, g);
    }
    c.series.push_back(std::move(s));
  }
  c.fix_y = true;
  c.y_min = std::max(0.0, std::floor(lo * 20) / 20);
  c.y_max = 1;
  char label[96];
  std::snprintf(label, sizeof label, "Young/Daly durable-only optimum: %.4f at %.3g h",
                rec.daly_goodput, rec.daly_s / 3600);
  c.hlines.emplace_back(rec.daly_goodput, label);
  return c;
}

}  // namespace memento::model
