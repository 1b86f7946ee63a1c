// Minimal self-contained SVG charts for the HTML report: line charts (with markers) and
// horizontal stacked bars. Output is an inline <svg> element; no scripts, no network.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tandem::loadgen {

struct ChartLine {
  std::string name;
  std::string color;
  bool dashed = false;
  bool markers = true;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in the given order
};

struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<ChartLine> lines;
};

struct BarRow {
  std::string label;
  std::vector<double> values;  // one per segment
};

struct StackedBars {
  std::string title;
  std::string x_label;
  std::vector<std::string> segments;
  std::vector<BarRow> rows;
};

std::string RenderLineChart(const LineChart& chart);
std::string RenderStackedBars(const StackedBars& bars);
// Palette color i (cycles).
std::string ChartColor(int i);
// Escapes &, <, >, " for HTML/SVG text.
std::string HtmlEscape(const std::string& text);

}  // namespace tandem::loadgen
