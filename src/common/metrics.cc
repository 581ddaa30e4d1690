#include "common/metrics.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "common/check.h"
#include "fmt/format.h"

namespace memento {
namespace {

bool ValidName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string Escape(const std::string& s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Integers (counts, bytes) exactly; fractions with enough digits.
  if (v == std::floor(v) && std::fabs(v) < 9.0e15)
    return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{:.9g}", v);
}

}  // namespace

void MetricsText::Sample(const std::string& name, const char* type, const std::string& help,
                         double value, const Labels& labels) {
  MEMENTO_CHECK(ValidName(name));
  if (name != last_name_) {
    // A metric's samples must stay together: a name seen before is a bug.
    MEMENTO_CHECK(names_.insert(name).second);
    out_ += "# HELP " + name + " " + Escape(help, false) + "\n";
    out_ += "# TYPE " + name + " " + type + "\n";
    last_name_ = name;
  }
  out_ += name;
  if (!labels.empty()) {
    out_ += "{";
    for (size_t i = 0; i < labels.size(); ++i) {
      MEMENTO_CHECK(ValidName(labels[i].first));
      if (i > 0) out_ += ",";
      out_ += labels[i].first + "=\"" + Escape(labels[i].second, true) + "\"";
    }
    out_ += "}";
  }
  out_ += " " + FormatValue(value) + "\n";
}

void MetricsText::Counter(const std::string& name, const std::string& help, double value,
                          const Labels& labels) {
  Sample(name, "counter", help, value, labels);
}

void MetricsText::Gauge(const std::string& name, const std::string& help, double value,
                        const Labels& labels) {
  Sample(name, "gauge", help, value, labels);
}

bool FindMetric(const std::string& text, const std::string& name, const std::string& labels,
                double* value) {
  const std::string want = labels.empty() ? name + " " : name + "{" + labels + "} ";
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, want.size(), want) != 0) continue;
    const std::string v = line.substr(want.size());
    if (v == "NaN") {
      *value = NAN;
    } else if (v == "+Inf") {
      *value = INFINITY;
    } else if (v == "-Inf") {
      *value = -INFINITY;
    } else {
      char* end = nullptr;
      *value = std::strtod(v.c_str(), &end);
      if (end == v.c_str()) return false;
    }
    return true;
  }
  return false;
}

}  // namespace memento
