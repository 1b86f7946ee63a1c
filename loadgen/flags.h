// Command-line flags of tandem-loadgen (CLI11), named as in `vllm bench serve`.
#pragma once

#include "loadgen/config.h"

namespace tandem::loadgen {

// Fills `config` from argv. Returns -1 to continue, or an exit code (0 after --help, 2 on a
// bad flag, with the message printed).
int ParseFlags(int argc, char** argv, Config* config);

}  // namespace tandem::loadgen
