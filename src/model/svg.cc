#include "model/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace memento::model {

std::string SvgEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

constexpr double kW = 800, kH = 500, kLeft = 80, kRight = 180, kTop = 50, kBottom = 60;
const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string Label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// "Nice" ticks covering [lo, hi].
std::vector<double> Ticks(double lo, double hi) {
  std::vector<double> out;
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / 5;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (mag * m >= raw) {
      step = mag * m;
      break;
    }
  }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push_back(v);
  return out;
}

}  // namespace

std::string RenderSvg(const Chart& chart) {
  const double inf = std::numeric_limits<double>::infinity();
  double x_lo = inf, x_hi = -inf, y_lo = inf, y_hi = -inf;
  auto fx = [&](double x) { return chart.log_x ? std::log10(x) : x; };
  for (const auto& s : chart.series) {
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (chart.log_x && x <= 0)) continue;
      x_lo = std::min(x_lo, fx(x));
      x_hi = std::max(x_hi, fx(x));
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  }
  for (const auto& [y, label] : chart.hlines) {
    y_lo = std::min(y_lo, y);
    y_hi = std::max(y_hi, y);
  }
  if (chart.fix_y) {
    y_lo = chart.y_min;
    y_hi = chart.y_max;
  }
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1;
  if (!std::isfinite(y_lo)) y_lo = 0, y_hi = 1;
  if (x_hi <= x_lo) x_hi = x_lo + 1;
  if (y_hi <= y_lo) y_hi = y_lo + 1;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (fx(x) - x_lo) / (x_hi - x_lo) * pw; };
  auto py = [&](double y) { return kTop + (1 - (y - y_lo) / (y_hi - y_lo)) * ph; };

  std::string o;
  o += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Num(kW) + "\" height=\"" + Num(kH) +
       "\" viewBox=\"0 0 " + Num(kW) + " " + Num(kH) + "\" font-family=\"sans-serif\">\n";
  o += "<title>" + SvgEscape(chart.title) + "</title>\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o += "<text x=\"" + Num(kW / 2) + "\" y=\"25\" text-anchor=\"middle\" font-size=\"16\">" +
       SvgEscape(chart.title) + "</text>\n";
  // Axes and ticks.
  o += "<g class=\"axes\" stroke=\"black\" fill=\"none\">\n";
  o += "<rect x=\"" + Num(kLeft) + "\" y=\"" + Num(kTop) + "\" width=\"" + Num(pw) +
       "\" height=\"" + Num(ph) + "\"/>\n</g>\n";
  o += "<g class=\"ticks\" font-size=\"11\">\n";
  std::vector<double> xt;
  if (chart.log_x) {
    for (double e = std::ceil(x_lo - 1e-9); e <= x_hi + 1e-9; e += 1) xt.push_back(std::pow(10, e));
    if (xt.size() < 2) xt = {std::pow(10, x_lo), std::pow(10, x_hi)};
  } else {
    xt = Ticks(x_lo, x_hi);
  }
  for (double x : xt) {
    const double X = px(x);
    o += "<line x1=\"" + Num(X) + "\" y1=\"" + Num(kTop + ph) + "\" x2=\"" + Num(X) + "\" y2=\"" +
         Num(kTop) + "\" stroke=\"#ddd\"/>\n";
    o += "<text x=\"" + Num(X) + "\" y=\"" + Num(kTop + ph + 16) + "\" text-anchor=\"middle\">" +
         Label(x) + "</text>\n";
  }
  for (double y : Ticks(y_lo, y_hi)) {
    const double Y = py(y);
    o += "<line x1=\"" + Num(kLeft) + "\" y1=\"" + Num(Y) + "\" x2=\"" + Num(kLeft + pw) +
         "\" y2=\"" + Num(Y) + "\" stroke=\"#ddd\"/>\n";
    o += "<text x=\"" + Num(kLeft - 6) + "\" y=\"" + Num(Y + 4) + "\" text-anchor=\"end\">" +
         Label(y) + "</text>\n";
  }
  o += "</g>\n";
  o += "<text x=\"" + Num(kLeft + pw / 2) + "\" y=\"" + Num(kH - 15) +
       "\" text-anchor=\"middle\" font-size=\"13\">" + SvgEscape(chart.x_label) + "</text>\n";
  o += "<text transform=\"translate(20," + Num(kTop + ph / 2) +
       ") rotate(-90)\" text-anchor=\"middle\" font-size=\"13\">" + SvgEscape(chart.y_label) +
       "</text>\n";
  for (const auto& [y, label] : chart.hlines) {
    const double Y = py(y);
    o += "<line class=\"threshold\" data-value=\"" + Label(y) + "\" x1=\"" + Num(kLeft) +
         "\" y1=\"" + Num(Y) + "\" x2=\"" + Num(kLeft + pw) + "\" y2=\"" + Num(Y) +
         "\" stroke=\"black\" stroke-dasharray=\"6 4\"/>\n";
    o += "<text x=\"" + Num(kLeft + 4) + "\" y=\"" + Num(Y - 4) + "\" font-size=\"11\">" +
         SvgEscape(label) + "</text>\n";
  }
  // Curves, clipped to the plot area, and the legend.
  o += "<clipPath id=\"plot\"><rect x=\"" + Num(kLeft) + "\" y=\"" + Num(kTop) + "\" width=\"" +
       Num(pw) + "\" height=\"" + Num(ph) + "\"/></clipPath>\n";
  for (size_t i = 0; i < chart.series.size(); ++i) {
    const auto& s = chart.series[i];
    const char* color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    std::string pts;
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (chart.log_x && x <= 0)) continue;
      if (!pts.empty()) pts += ' ';
      pts += Num(px(x)) + "," + Num(py(y));
    }
    o += "<polyline class=\"series\" data-name=\"" + SvgEscape(s.name) +
         "\" clip-path=\"url(#plot)\" " + "fill=\"none\" stroke=\"" + color +
         "\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
    const double ly = kTop + 10 + 20 * static_cast<double>(i);
    o += "<line x1=\"" + Num(kW - kRight + 15) + "\" y1=\"" + Num(ly) + "\" x2=\"" +
         Num(kW - kRight + 40) + "\" y2=\"" + Num(ly) + "\" stroke=\"" + color +
         "\" stroke-width=\"2\"/>\n";
    o += "<text x=\"" + Num(kW - kRight + 46) + "\" y=\"" + Num(ly + 4) + "\" font-size=\"12\">" +
         SvgEscape(s.name) + "</text>\n";
  }
  o += "</svg>\n";
  return o;
}

}  // namespace memento::model
