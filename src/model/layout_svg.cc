#include "model/layout_svg.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "common/human.h"
#include "model/svg.h"

namespace memento::model {
namespace {

constexpr double kBoxW = 150, kBoxH = 78, kGapX = 30, kRowH = 150, kLeft = 150, kTop = 70;
const char* const kRackColors[] = {"#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e",
                                   "#8c564b", "#17becf", "#bcbd22", "#e377c2"};

std::string F(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

}  // namespace

std::string RenderLayoutSvg(const topo::Plan& plan, const topo::RecoveryPlan* recovery) {
  const int num_nodes = static_cast<int>(plan.nodes.size());
  // Rows: distinct sharding-group node sets, in group order; a node is drawn
  // in the first row that holds it. Nodes in no sharding group get a row.
  std::vector<std::vector<int>> rows;
  std::vector<std::string> row_names;
  std::set<std::vector<int>> seen;
  std::vector<char> placed(num_nodes, 0);
  std::map<std::vector<int>, size_t> row_of;
  for (const auto& g : plan.groups) {
    if (g.kind != topo::GroupKind::kShardingGroup) continue;
    std::vector<int> key = g.nodes;
    std::sort(key.begin(), key.end());
    auto it = row_of.find(key);
    if (it != row_of.end()) {
      row_names[it->second] += ", " + g.name.substr(0, g.name.find(' '));
      continue;
    }
    std::vector<int> row;
    for (int n : g.nodes) {
      if (!placed[n]) row.push_back(n), placed[n] = 1;
    }
    if (row.empty()) continue;
    row_of[key] = rows.size();
    rows.push_back(row);
    row_names.push_back(g.name.substr(0, g.name.find(' ')) + " [" + g.scheme + "]");
  }
  std::vector<int> rest;
  for (int n = 0; n < num_nodes; ++n) {
    if (!placed[n]) rest.push_back(n);
  }
  if (!rest.empty()) {
    rows.push_back(rest);
    row_names.push_back("other nodes");
  }
  std::map<std::string, int> rack_index;
  for (int n = 0; n < num_nodes; ++n) {
    const std::string rack(plan.topology.Rack(n));
    if (!rack.empty()) rack_index.emplace(rack, static_cast<int>(rack_index.size()));
  }
  std::set<int> lost;
  if (recovery) lost.insert(recovery->failed_nodes.begin(), recovery->failed_nodes.end());

  size_t widest = 1;
  for (const auto& r : rows) widest = std::max(widest, r.size());
  const double width = kLeft + widest * (kBoxW + kGapX) + 20;
  const double height = kTop + rows.size() * kRowH + 60;
  std::vector<std::pair<double, double>> pos(num_nodes);  // box centre

  std::string o;
  o += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + F(width) + "\" height=\"" +
       F(height) + "\" viewBox=\"0 0 " + F(width) + " " + F(height) +
       "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o += "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" "
       "markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#d62728\"/>"
       "</marker></defs>\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::string title =
      "Placement: " + topo::PolicyName(plan.policy) + ", dp=" + std::to_string(plan.topology.dp) +
      " tp=" + std::to_string(plan.topology.tp) + " pp=" + std::to_string(plan.topology.pp) + ", " +
      std::to_string(num_nodes) + " nodes, protection " + std::to_string(plan.protection);
  if (recovery) {
    title += recovery->recoverable ? "; failure set recoverable from memory"
                                   : "; failure set NOT recoverable from memory";
  }
  o += "<title>" + SvgEscape(title) + "</title>\n";
  o += "<text x=\"10\" y=\"22\" font-size=\"15\">" + SvgEscape(title) + "</text>\n";
  if (!rack_index.empty()) {
    std::string legend;
    double x = 10;
    for (const auto& [rack, i] : rack_index) {
      const char* color = kRackColors[i % 8];
      o += "<rect x=\"" + F(x) + "\" y=\"34\" width=\"12\" height=\"12\" fill=\"none\" stroke=\"" +
           color + "\" stroke-width=\"3\"/><text x=\"" + F(x + 16) + "\" y=\"44\">" +
           SvgEscape(rack) + "</text>\n";
      x += 20 + 7.0 * rack.size() + 10;
    }
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const double y = kTop + r * kRowH;
    std::string members;
    for (int n : rows[r]) members += (members.empty() ? "" : ",") + std::to_string(n);
    o += "<g class=\"group\" data-nodes=\"" + members + "\">\n";
    o += "<rect x=\"5\" y=\"" + F(y - 8) + "\" width=\"" + F(width - 10) + "\" height=\"" +
         F(kBoxH + 16) + "\" fill=\"#f4f4f4\" stroke=\"#bbb\"/>\n";
    o += "<text x=\"12\" y=\"" + F(y + kBoxH / 2) + "\">" + SvgEscape(row_names[r]) + "</text>\n";
    for (size_t i = 0; i < rows[r].size(); ++i) {
      const int n = rows[r][i];
      const auto& np = plan.nodes[n];
      const double x = kLeft + i * (kBoxW + kGapX);
      pos[n] = {x + kBoxW / 2, y + kBoxH / 2};
      const std::string rack(plan.topology.Rack(n));
      const bool is_lost = lost.count(n) > 0;
      const char* stroke = rack.empty() ? "#333" : kRackColors[rack_index[rack] % 8];
      o += "<g class=\"node" + std::string(is_lost ? " lost" : "") + "\" data-node=\"" +
           std::to_string(n) + "\" data-rack=\"" + SvgEscape(rack) + "\">\n";
      o += "<rect x=\"" + F(x) + "\" y=\"" + F(y) + "\" width=\"" + F(kBoxW) + "\" height=\"" +
           F(kBoxH) + "\" rx=\"6\" fill=\"" + (is_lost ? "#f8d0d0" : "white") + "\" stroke=\"" +
           stroke + "\" stroke-width=\"3\"/>\n";
      const std::string head = "node " + std::to_string(n) +
                               (rack.empty() ? "" : " (" + rack + ")") + (is_lost ? " LOST" : "");
      const std::string l1 =
          std::to_string(np.pieces.size()) + " pieces " + HumanBytes(np.piece_bytes);
      const std::string l2 =
          std::to_string(np.copies.size()) + " copies " + HumanBytes(np.copy_bytes);
      const std::string l3 =
          std::to_string(np.parities.size()) + " parity " + HumanBytes(np.parity_bytes);
      int line = 0;
      for (const std::string& text : {head, l1, l2, l3}) {
        o += "<text x=\"" + F(x + 6) + "\" y=\"" + F(y + 16 + 18 * line) + "\"" +
             (line == 0 ? " font-weight=\"bold\"" : "") + ">" + SvgEscape(text) + "</text>\n";
        ++line;
      }
      o += "</g>\n";
    }
    o += "</g>\n";
  }
  if (recovery) {
    // One arrow per (survivor, lost node, kind).
    std::set<std::tuple<int, int, std::string>> arrows;
    for (const auto& recipe : recovery->recipes) {
      const int to = plan.pieces[recipe.piece].node;
      for (const auto& step : recipe.steps) {
        if (step.kind == topo::RecoveryStep::Kind::kCopy) {
          arrows.emplace(step.node, to, "copy");
        } else {
          for (const auto& in : step.inputs) {
            if (!in.zero && in.node >= 0) arrows.emplace(in.node, to, "decode");
          }
        }
      }
    }
    // Curves in the gaps between rows: same row, from the bottom of the
    // survivor's box dipping below the row to the bottom of the lost one;
    // other rows, from the facing edges. Arrows into one node fan out.
    int k = 0;
    for (const auto& [from, to, kind] : arrows) {
      auto [x1, y1] = pos[from];
      auto [x2, y2] = pos[to];
      const double fan = 8.0 * (k % 7 - 3);
      std::string d;
      if (y1 == y2) {
        const double yb = y1 + kBoxH / 2;
        d = "M" + F(x1) + "," + F(yb) + " Q" + F((x1 + x2) / 2) + "," + F(yb + 45 + 6 * (k % 4)) +
            " " + F(x2 + fan) + "," + F(yb);
      } else {
        const double sy = y1 < y2 ? y1 + kBoxH / 2 : y1 - kBoxH / 2;
        const double ty = y1 < y2 ? y2 - kBoxH / 2 : y2 + kBoxH / 2;
        d = "M" + F(x1) + "," + F(sy) + " Q" + F((x1 + x2) / 2 + 20) + "," + F((sy + ty) / 2) +
            " " + F(x2 + fan) + "," + F(ty);
      }
      o += "<path class=\"rebuild\" data-from=\"" + std::to_string(from) + "\" data-to=\"" +
           std::to_string(to) + "\" data-kind=\"" + kind + "\" d=\"" + d +
           "\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"1.5\"" +
           (kind == "decode" ? " stroke-dasharray=\"5 3\"" : "") +
           " marker-end=\"url(#arrow)\"/>\n";
      ++k;
    }
    o += "<text x=\"10\" y=\"" + F(height - 20) +
         "\">red arrows: survivor -> lost node; solid = copy, dashed = decode input</text>\n";
  }
  o += "</svg>\n";
  return o;
}

}  // namespace memento::model
