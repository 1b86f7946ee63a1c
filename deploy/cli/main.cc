// tandem: one binary, one subcommand per job (make-model, generate, serve, ...).
#include <cstdio>
#include <functional>
#include <vector>

#include "CLI/CLI.hpp"
#include "deploy/cli/commands.h"

namespace tandem::cli {
namespace {

// One line per subcommand.
const Command kCommands[] = {
    {"bench", "Benchmark the engine in one process: latency, decode, prefill, throughput",
     AddBenchCommand},
    {"generate", "Generate text from a prompt in one process (engine only, no RPC)",
     AddGenerateCommand},
    {"make-model", "Write a random-weight checkpoint in Hugging Face format", AddMakeModelCommand},
    {"serve", "Start a router and workers from a layout (default: tiny model, 1P + 1D)",
     AddServeCommand},
};

int Main(int argc, char** argv) {
  CLI::App app{"tandem: a disaggregated (prefill/decode) LLM inference server"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, std::function<int()>>> subs;
  for (const Command& c : kCommands) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    subs.emplace_back(sub, c.add(sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : subs) {
    if (sub->parsed()) return run();
  }
  return 2;
}

}  // namespace
}  // namespace tandem::cli

int main(int argc, char** argv) { return tandem::cli::Main(argc, argv); }
