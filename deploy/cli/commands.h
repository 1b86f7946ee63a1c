// The `tandem` binary's subcommands. Each lives in its own <name>_command.cc and is listed once
// in main.cc's kCommands table.
#pragma once

#include <functional>

#include "CLI/CLI.hpp"

namespace tandem::cli {

// Adds the subcommand's options to `sub` (bound to state the function keeps alive) and returns
// what to run once the command line has parsed: the process exit code.
using AddCommandFn = std::function<int()> (*)(CLI::App* sub);

struct Command {
  const char* name;
  const char* help;
  AddCommandFn add;
};

std::function<int()> AddBenchCommand(CLI::App* sub);
std::function<int()> AddGenerateCommand(CLI::App* sub);
std::function<int()> AddMakeModelCommand(CLI::App* sub);
std::function<int()> AddServeCommand(CLI::App* sub);

}  // namespace tandem::cli
