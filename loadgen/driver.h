// The tandem-loadgen program: builds the workload, runs one benchmark or a sweep, prints the
// result block, writes JSON / CSV / HTML, or renders a --compare report.
#pragma once

#include "loadgen/config.h"

namespace tandem::loadgen {

// Returns the process exit code.
int RunLoadgen(const Config& config);

}  // namespace tandem::loadgen
