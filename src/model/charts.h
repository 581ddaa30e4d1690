// The two pictures of `memento plan reliability --svg`: survival against time
// per policy with the threshold line (REFT Figure 8's analogue) and goodput
// against the durable interval per policy (with the Young/Daly baseline).
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "memento/status.h"
#include "model/recommend.h"
#include "model/reliability.h"
#include "model/svg.h"

namespace memento::model {

// One series per structure, `points` samples of S(t) on [0, horizon] (rate
// units), and the threshold as a horizontal line.
[[nodiscard]] Result<Chart> SurvivalChart(const std::vector<Structure>& structures,
                                          const FailureRates& rates, double threshold,
                                          double horizon, int points, const std::string& unit);

// One series per evaluated policy: goodput against the durable interval (in
// hours, log axis), every point of its curve.
Chart GoodputChart(const Recommendation& rec);

}  // namespace memento::model
