// The whole program path (flags → sweep → files) against the in-process fake server, and
// Ctrl-C (a real SIGINT) keeping what was measured.
#include "loadgen/driver.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "loadgen/fake_server.h"
#include "loadgen/flags.h"
#include "loadgen/sweep_prompts.h"

namespace tandem::loadgen {
namespace {

namespace fs = std::filesystem;

struct Server {
  Server(double ttft_ms, double itl_ms) : server(Options(ttft_ms, itl_ms)) {
    port = *server.Start();
  }
  static FakeServerOptions Options(double ttft_ms, double itl_ms) {
    FakeServerOptions o;
    o.script = [=](const FakeRequest&) {
      FakeResponse r;
      r.ttft_ms = ttft_ms;
      r.itl_ms = {itl_ms};
      return r;
    };
    return o;
  }
  FakeServer server;
  int port = 0;
};

int RunCli(std::vector<std::string> args) {
  args.insert(args.begin(), "tandem-loadgen");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  Config config;
  int code = ParseFlags(static_cast<int>(argv.size()), argv.data(), &config);
  if (code >= 0) return code;
  return RunLoadgen(config);
}

std::vector<fs::path> FilesEndingWith(const fs::path& dir, const std::string& suffix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      out.push_back(e.path());
    }
  }
  return out;
}

TEST(DriverTest, RateSweepWritesPointsSweepCsvAndReportThenCompareMergesThem) {
  Server s(2, 1);
  fs::path dir = fs::path(testing::TempDir()) / "lg_sweep";
  fs::remove_all(dir);
  int code = RunCli({"--base-url", "http://127.0.0.1:" + std::to_string(s.port), "--num-prompts",
                     "20", "--random-input-len", "8", "--random-output-len", "4", "--sweep",
                     "rate=50,100", "--goodput", "ttft:500", "--result-dir", dir.string(),
                     "--label", "fake", "--disable-progress"});
  EXPECT_EQ(code, 0);
  EXPECT_EQ(FilesEndingWith(dir, "-rate50.json").size(), 1u);
  EXPECT_EQ(FilesEndingWith(dir, "-rate100.csv").size(), 1u);
  auto sweeps = FilesEndingWith(dir, "-sweep.json");
  ASSERT_EQ(sweeps.size(), 1u);
  std::ifstream in(sweeps[0]);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json sweep = nlohmann::json::parse(text.str());
  ASSERT_EQ(sweep["points"].size(), 2u);
  EXPECT_EQ(sweep["points"][1]["request_rate"], 100.0);
  EXPECT_EQ(sweep["points"][1]["completed"], 20);
  EXPECT_EQ(sweep["points"][0]["model_id"], "fake");  // from GET /v1/models
  EXPECT_EQ(sweep["points"][0]["request_goodput"].get<double>(),
            sweep["points"][0]["request_throughput"].get<double>());
  EXPECT_EQ(FilesEndingWith(dir, "-report.html").size(), 1u);

  fs::path report = dir / "cmp.html";
  EXPECT_EQ(RunCli({"--compare", sweeps[0].string(),
                    FilesEndingWith(dir, "-rate50.json")[0].string(), "--report", report.string()}),
            0);
  EXPECT_TRUE(fs::exists(report));
  EXPECT_NE(RunCli({"--sweep", "speed=1"}), 0);
}

nlohmann::json ReadJson(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str(), nullptr, false);
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A fake server that keeps every prompt it was sent, in the order it read them.
struct RecordingServer {
  RecordingServer() : server(Options(this)) { port = *server.Start(); }
  static FakeServerOptions Options(RecordingServer* self) {
    FakeServerOptions o;
    o.script = [self](const FakeRequest& r) {
      std::lock_guard<std::mutex> lock(self->mu);
      self->prompts.push_back(r.prompt);
      return FakeResponse{};
    };
    return o;
  }
  // Prompts [from, from + n) as a set (a point's requests arrive in any order within it).
  std::set<std::string> Range(size_t from, size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    return {prompts.begin() + from, prompts.begin() + std::min(prompts.size(), from + n)};
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return prompts.size();
  }
  std::mutex mu;
  std::vector<std::string> prompts;
  FakeServer server;
  int port = 0;
};

// A sweep's points run one after another, so the server sees point 0's requests, then point
// 1's, ...: with fresh prompts (the default) no prompt reaches it twice, point 0's are a plain
// run's with the same seed, and every point records its seed; with `same` the points repeat
// point 0's prompts and the results say so.
TEST(DriverTest, SweepPointsSendFreshPromptsAndRecordTheirSeeds) {
  const int n = 10;
  std::vector<std::string> common = {"--model",
                                     "m",
                                     "--num-prompts",
                                     std::to_string(n),
                                     "--random-input-len",
                                     "16",
                                     "--random-output-len",
                                     "2",
                                     "--seed",
                                     "7",
                                     "--disable-progress"};
  auto with = [&](const RecordingServer& s, std::vector<std::string> args) {
    args.insert(args.end(), {"--base-url", "http://127.0.0.1:" + std::to_string(s.port)});
    args.insert(args.end(), common.begin(), common.end());
    return args;
  };
  RecordingServer plain;
  fs::path dir = fs::path(testing::TempDir()) / "lg_sweep_prompts";
  fs::remove_all(dir);
  ASSERT_EQ(RunCli(with(plain, {"--request-rate", "500", "--save-result", "--result-dir",
                                dir.string(), "--result-filename", "plain.json"})),
            0);
  ASSERT_EQ(plain.size(), static_cast<size_t>(n));
  EXPECT_EQ(ReadJson(dir / "plain.json")["seed"], 7);
  EXPECT_EQ(ReadJson(dir / "plain.json").contains("prompts_shared_across_points"), false);

  for (const std::string mode : {"fresh", "same"}) {
    RecordingServer s;
    fs::path out = dir / mode;
    std::vector<std::string> args = {"--sweep",    "rate=400,800,1600", "--result-dir",
                                     out.string(), "--label",           "x"};
    if (mode == "same") args.insert(args.end(), {"--sweep-prompts", "same"});
    ASSERT_EQ(RunCli(with(s, args)), 0) << mode;
    ASSERT_EQ(s.size(), static_cast<size_t>(3 * n)) << mode;
    std::vector<std::set<std::string>> points = {s.Range(0, n), s.Range(n, n), s.Range(2 * n, n)};
    EXPECT_EQ(points[0], plain.Range(0, n)) << mode;  // point 0 is the plain run
    auto sweeps = FilesEndingWith(out, "-sweep.json");
    ASSERT_EQ(sweeps.size(), 1u);
    nlohmann::json sweep = ReadJson(sweeps[0]);
    ASSERT_EQ(sweep["points"].size(), 3u);
    const bool fresh = mode == "fresh";
    EXPECT_EQ(sweep["prompts_shared_across_points"], !fresh);
    EXPECT_EQ(sweep["sweep_prompts"], mode);
    for (int i = 0; i < 3; ++i) {
      const nlohmann::json& p = sweep["points"][i];
      EXPECT_EQ(p["sweep_point"], i);
      EXPECT_EQ(p["prompts_shared_across_points"], !fresh);
      EXPECT_EQ(p["seed"].get<uint64_t>(), fresh ? SweepPointSeed(7, i) : 7u) << mode << i;
      EXPECT_EQ(points[i].size(), static_cast<size_t>(n));
      for (int j = 0; j < i; ++j) {
        std::set<std::string> both;
        std::set_intersection(points[i].begin(), points[i].end(), points[j].begin(),
                              points[j].end(), std::inserter(both, both.begin()));
        EXPECT_EQ(both.size(), fresh ? 0u : static_cast<size_t>(n)) << mode << i << j;
      }
    }
    // The per-point files, the sweep CSV and the report carry the seed too.
    auto point1 = FilesEndingWith(out, "-rate800.json");
    ASSERT_EQ(point1.size(), 1u);
    EXPECT_EQ(ReadJson(point1[0])["seed"], sweep["points"][1]["seed"]);
    std::string csv = ReadText(FilesEndingWith(out, "-sweep.csv")[0]);
    EXPECT_NE(csv.find(",seed,prompts_shared_across_points\n"), std::string::npos) << csv;
    EXPECT_NE(csv.find(absl::StrCat(sweep["points"][2]["seed"].dump(), ",",
                                    fresh ? "false" : "true", "\n")),
              std::string::npos)
        << csv;
    std::string html = ReadText(FilesEndingWith(out, "-report.html")[0]);
    EXPECT_NE(html.find(absl::StrCat("<td>", sweep["points"][1]["seed"].dump(), "</td>")),
              std::string::npos);
    EXPECT_EQ(html.find("the points sent the same prompts") != std::string::npos, !fresh);
  }
}

TEST(DriverTest, BadSweepPromptsValueIsRejected) {
  testing::internal::CaptureStderr();
  int code = RunCli({"--sweep", "rate=1,2", "--sweep-prompts", "new", "--model", "m"});
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(code, 0);
  EXPECT_NE(code, -1);
  EXPECT_NE(err.find("--sweep-prompts"), std::string::npos) << err;
  EXPECT_NE(err.find("new"), std::string::npos) << err;
  // A Config built in code (no CLI11 check) is refused by the driver, before any request.
  Config c;
  c.model = "m";
  c.base_url = "http://127.0.0.1:1";
  c.sweep_prompts = "new";
  testing::internal::CaptureStderr();
  EXPECT_EQ(RunLoadgen(c), 1);
  err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--sweep-prompts must be fresh or same, got 'new'"), std::string::npos) << err;
}

// The random dataset asks for exact output lengths, so ignore_eos is on unless switched off.
TEST(DriverTest, IgnoreEosDefaultsOnForRandomAndCanBeSwitchedOff) {
  for (const auto& [flag, want] : {std::pair<std::string, bool>{"", true},
                                   {"--ignore-eos", true},
                                   {"--no-ignore-eos", false}}) {
    std::atomic<int> seen{0}, with_ignore_eos{0};
    FakeServerOptions o;
    o.script = [&](const FakeRequest& r) {
      ++seen;
      if (r.ignore_eos) ++with_ignore_eos;
      return FakeResponse{};
    };
    FakeServer server(o);
    const int port = *server.Start();
    std::vector<std::string> args = {"--base-url",
                                     "http://127.0.0.1:" + std::to_string(port),
                                     "--model",
                                     "m",
                                     "--num-prompts",
                                     "3",
                                     "--random-input-len",
                                     "4",
                                     "--random-output-len",
                                     "2",
                                     "--disable-progress"};
    if (!flag.empty()) args.push_back(flag);
    ASSERT_EQ(RunCli(args), 0) << flag;
    EXPECT_EQ(seen.load(), 3) << flag;
    EXPECT_EQ(with_ignore_eos.load(), want ? 3 : 0) << flag;
  }
}

TEST(DriverTest, CtrlCStopsTheRunAndSavesWhatWasMeasured) {
  Server s(1, 100);  // each request streams for ~1 s
  fs::path dir = fs::path(testing::TempDir()) / "lg_sigint";
  fs::remove_all(dir);
  std::thread interrupter([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    kill(getpid(), SIGINT);
  });
  auto t0 = std::chrono::steady_clock::now();
  int code = RunCli({"--base-url", "http://127.0.0.1:" + std::to_string(s.port), "--model", "m",
                     "--num-prompts", "100", "--request-rate", "20", "--random-input-len", "4",
                     "--random-output-len", "10", "--save-result", "--result-dir", dir.string(),
                     "--result-filename", "out.json", "--disable-progress"});
  interrupter.join();
  EXPECT_EQ(code, 130);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  std::ifstream in(dir / "out.json");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["interrupted"], true);
  EXPECT_GT(j["not_sent"].get<int>(), 50);
  EXPECT_GT(j["failed_by_cause"]["cancelled"].get<int>(), 0);
}

}  // namespace
}  // namespace tandem::loadgen
