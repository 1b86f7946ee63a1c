#include "loadgen/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::loadgen {
namespace {

constexpr double kWidth = 620, kHeight = 360;
constexpr double kLeft = 70, kRight = 170, kTop = 36, kBottom = 50;  // margins; legend right

// 1-2-5 tick step covering [lo, hi] in about `target` steps.
double NiceStep(double span, int target) {
  double raw = span / target;
  double mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * mag) return m * mag;
  }
  return 10 * mag;
}

struct Axis {
  double lo = 0, hi = 1, step = 0.2;
  double Map(double v, double from, double to) const {
    return from + (v - lo) / (hi - lo) * (to - from);
  }
};

Axis MakeAxis(double lo, double hi, bool from_zero) {
  if (from_zero) lo = std::min(lo, 0.0);
  if (!(hi > lo)) hi = lo + 1;
  Axis a;
  a.step = NiceStep(hi - lo, 5);
  a.lo = std::floor(lo / a.step) * a.step;
  a.hi = std::ceil(hi / a.step) * a.step;
  return a;
}

std::string Num(double v) { return absl::StrFormat("%g", std::abs(v) < 1e-12 ? 0.0 : v); }

std::string Frame(const std::string& title, const std::string& x_label,
                  const std::string& y_label) {
  std::string s = absl::StrFormat(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" font-family="sans-serif" font-size="11">)",
      kWidth, kHeight);
  absl::StrAppend(
      &s, absl::StrFormat(R"(<text x="%g" y="20" font-size="14" font-weight="bold">%s</text>)",
                          kLeft, HtmlEscape(title)));
  absl::StrAppend(&s, absl::StrFormat(R"(<text x="%g" y="%g" text-anchor="middle">%s</text>)",
                                      kLeft + (kWidth - kLeft - kRight) / 2, kHeight - 10,
                                      HtmlEscape(x_label)));
  absl::StrAppend(
      &s,
      absl::StrFormat(
          R"svg(<text transform="translate(16,%g) rotate(-90)" text-anchor="middle">%s</text>)svg",
          kTop + (kHeight - kTop - kBottom) / 2, HtmlEscape(y_label)));
  return s;
}

void Ticks(const Axis& x, const Axis& y, std::string* s) {
  double x0 = kLeft, x1 = kWidth - kRight, y0 = kHeight - kBottom, y1 = kTop;
  for (double v = y.lo; v <= y.hi + y.step / 2; v += y.step) {
    double py = y.Map(v, y0, y1);
    absl::StrAppend(s, absl::StrFormat(R"(<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#ddd"/>)",
                                       x0, py, x1, py));
    absl::StrAppend(s, absl::StrFormat(R"(<text x="%g" y="%g" text-anchor="end">%s</text>)", x0 - 4,
                                       py + 4, Num(v)));
  }
  for (double v = x.lo; v <= x.hi + x.step / 2; v += x.step) {
    double px = x.Map(v, x0, x1);
    absl::StrAppend(s, absl::StrFormat(R"(<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#eee"/>)",
                                       px, y0, px, y1));
    absl::StrAppend(s, absl::StrFormat(R"(<text x="%g" y="%g" text-anchor="middle">%s</text>)", px,
                                       y0 + 14, Num(v)));
  }
  absl::StrAppend(
      s,
      absl::StrFormat(R"(<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#444"/>)",
                      x0, y1, x1 - x0, y0 - y1));
}

void Legend(int i, const std::string& name, const std::string& color, bool dashed, std::string* s) {
  double x = kWidth - kRight + 10, y = kTop + 10 + 16 * i;
  absl::StrAppend(
      s,
      absl::StrFormat(R"(<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="2"%s/>)",
                      x, y, x + 18, y, color, dashed ? R"( stroke-dasharray="5,3")" : ""));
  absl::StrAppend(
      s, absl::StrFormat(R"(<text x="%g" y="%g">%s</text>)", x + 22, y + 4, HtmlEscape(name)));
}

}  // namespace

std::string ChartColor(int i) {
  static const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return kPalette[i % 10];
}

std::string HtmlEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
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
        out.push_back(c);
    }
  }
  return out;
}

std::string RenderLineChart(const LineChart& chart) {
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const ChartLine& line : chart.lines) {
    for (auto [x, y] : line.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      xmin = std::min(xmin, x), xmax = std::max(xmax, x);
      ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
  }
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  Axis x = MakeAxis(xmin, xmax, false), y = MakeAxis(ymin, ymax, true);
  std::string s = Frame(chart.title, chart.x_label, chart.y_label);
  Ticks(x, y, &s);
  double x0 = kLeft, x1 = kWidth - kRight, y0 = kHeight - kBottom, y1 = kTop;
  for (size_t i = 0; i < chart.lines.size(); ++i) {
    const ChartLine& line = chart.lines[i];
    std::string path;
    for (auto [vx, vy] : line.points) {
      if (!std::isfinite(vx) || !std::isfinite(vy)) continue;
      absl::StrAppend(&path, path.empty() ? "M" : " L", Num(x.Map(vx, x0, x1)), ",",
                      Num(y.Map(vy, y0, y1)));
      if (line.markers) {
        absl::StrAppend(&s, absl::StrFormat(R"(<circle cx="%g" cy="%g" r="3" fill="%s"/>)",
                                            x.Map(vx, x0, x1), y.Map(vy, y0, y1), line.color));
      }
    }
    absl::StrAppend(
        &s, absl::StrFormat(R"(<path d="%s" fill="none" stroke="%s" stroke-width="2"%s/>)", path,
                            line.color, line.dashed ? R"( stroke-dasharray="5,3")" : ""));
    Legend(static_cast<int>(i), line.name, line.color, line.dashed, &s);
  }
  return s + "</svg>";
}

std::string RenderStackedBars(const StackedBars& bars) {
  double total_max = 0;
  for (const BarRow& row : bars.rows) {
    double t = 0;
    for (double v : row.values) t += std::max(0.0, v);
    total_max = std::max(total_max, t);
  }
  Axis x = MakeAxis(0, total_max > 0 ? total_max : 1, true);
  double x0 = kLeft + 80, x1 = kWidth - kRight;
  double row_h = 22, height = kTop + row_h * bars.rows.size() + kBottom + 10;
  std::string s = absl::StrFormat(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" font-family="sans-serif" font-size="11">)",
      kWidth, height);
  absl::StrAppend(
      &s, absl::StrFormat(R"(<text x="10" y="20" font-size="14" font-weight="bold">%s</text>)",
                          HtmlEscape(bars.title)));
  double bottom = kTop + row_h * bars.rows.size();
  for (double v = x.lo; v <= x.hi + x.step / 2; v += x.step) {
    double px = x.Map(v, x0, x1);
    absl::StrAppend(
        &s,
        absl::StrFormat(
            R"(<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#ddd"/><text x="%g" y="%g" text-anchor="middle">%s</text>)",
            px, kTop, px, bottom, px, bottom + 14, Num(v)));
  }
  absl::StrAppend(&s, absl::StrFormat(R"(<text x="%g" y="%g" text-anchor="middle">%s</text>)",
                                      (x0 + x1) / 2, bottom + 32, HtmlEscape(bars.x_label)));
  for (size_t r = 0; r < bars.rows.size(); ++r) {
    double y = kTop + row_h * r + 3, px = x0;
    absl::StrAppend(&s, absl::StrFormat(R"(<text x="%g" y="%g" text-anchor="end">%s</text>)",
                                        x0 - 6, y + 12, HtmlEscape(bars.rows[r].label)));
    for (size_t k = 0; k < bars.rows[r].values.size(); ++k) {
      double w = x.Map(std::max(0.0, bars.rows[r].values[k]), x0, x1) - x0;
      absl::StrAppend(
          &s,
          absl::StrFormat(
              R"(<rect x="%g" y="%g" width="%g" height="16" fill="%s"><title>%s: %.2f ms</title></rect>)",
              px, y, w, ChartColor(static_cast<int>(k)), HtmlEscape(bars.segments[k]),
              bars.rows[r].values[k]));
      px += w;
    }
  }
  for (size_t k = 0; k < bars.segments.size(); ++k) {
    Legend(static_cast<int>(k), bars.segments[k], ChartColor(static_cast<int>(k)), false, &s);
  }
  return s + "</svg>";
}

}  // namespace tandem::loadgen
