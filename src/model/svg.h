// Line charts as SVG text, written by hand (no plotting dependency): the
// pictures of `memento plan reliability --svg` (survival against time per
// policy with the threshold line, REFT Figure 8's analogue; goodput against
// the durable interval).
//
// Every series is one <polyline class="series" data-name="NAME"> whose
// `points` hold exactly the series' points (in SVG coordinates), so a reader
// (or a test) can find each curve and count its points; horizontal reference
// lines are <line class="threshold" data-value="V">.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace memento::model {

struct ChartSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y) in data units
};

struct Chart {
  std::string title, x_label, y_label;
  bool log_x = false;  // log10 x axis (x must be > 0)
  bool fix_y = false;  // use y_min / y_max instead of the data's range
  double y_min = 0, y_max = 1;
  std::vector<ChartSeries> series;
  std::vector<std::pair<double, std::string>> hlines;  // (y, label)
};

// `s` with the XML special characters (& < > ") escaped, for SVG text and
// attribute values; shared by the charts and the placement picture.
std::string SvgEscape(const std::string& s);

// A standalone SVG document (UTF-8, XML-escaped labels). Points that are not
// finite are left out of their polyline.
std::string RenderSvg(const Chart& chart);

}  // namespace memento::model
