// ParallelFor: splits [0, n) into contiguous chunks run on a process-wide pool of worker threads
// (one per core, or TANDEM_NUM_THREADS). The CPU reference kernels use it so tests stay fast.
// Thread-safe; nested calls from inside a worker run serially (no deadlock, no oversubscription).
#pragma once

#include <cstdint>
#include <functional>

namespace tandem {

// Calls fn(begin, end) on disjoint ranges covering [0, n), each at least `min_chunk` long
// (except the last), and returns when all have finished.
void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

// Number of threads ParallelFor may use (>= 1).
int NumWorkerThreads();

}  // namespace tandem
