// A CUDA injection library that records every kernel's start and end on the GPU with CUPTI's
// activity API, for a timeline of graph-replayed decode steps (ncu runs kernels one by one and
// cannot show how they overlap; nsys does not run on our GPU machine). Any CUDA program loads it
// through the driver's injection hook, with no change to the program:
//
//   CUDA_INJECTION64_PATH=$PWD/libtandem_kernel_trace.so TANDEM_KERNEL_TRACE=trace.csv prog ...
//
// CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL keeps kernels concurrent (programmatic dependent launch
// still overlaps a kernel with its predecessor), and graph nodes are recorded one by one.
// Output, written when the process exits: one CSV line per kernel, in start order:
//   start_ns,end_ns,stream,graph_id,grid,block,registers,name
// Times are the GPU's global timer in ns. Build: tools/gpu/kernel_trace/build.sh.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct KernelRecord {
  uint64_t start = 0;
  uint64_t end = 0;
  uint32_t stream = 0;
  uint32_t graph_id = 0;
  int32_t grid = 0;
  int32_t block = 0;
  uint16_t registers = 0;
  std::string name;
};

std::mutex g_mu;
std::vector<KernelRecord>* g_records = new std::vector<KernelRecord>();  // guarded by g_mu
constexpr size_t kBufferBytes = 8 << 20;

#define CUPTI_OR_DIE(call)                                                             \
  do {                                                                                 \
    CUptiResult r_ = (call);                                                           \
    if (r_ != CUPTI_SUCCESS) {                                                         \
      const char* msg_ = nullptr;                                                      \
      cuptiGetResultString(r_, &msg_);                                                 \
      std::fprintf(stderr, "kernel_trace: %s failed: %s\n", #call, msg_ ? msg_ : "?"); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

std::string Demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = (status == 0 && out != nullptr) ? out : name;
  std::free(out);
  for (char& c : s) {
    if (c == ',') c = ';';  // keeps the CSV's last column free of commas
  }
  return s;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<KernelRecord> batch;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    batch.push_back({k->start, k->end, k->streamId, k->graphId, k->gridX * k->gridY * k->gridZ,
                     k->blockX * k->blockY * k->blockZ, k->registersPerThread, Demangle(k->name)});
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  g_records->insert(g_records->end(), batch.begin(), batch.end());
}

void WriteTrace() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("TANDEM_KERNEL_TRACE");
  std::lock_guard<std::mutex> lock(g_mu);
  std::sort(g_records->begin(), g_records->end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.start < b.start; });
  FILE* f = std::fopen(path != nullptr ? path : "kernel_trace.csv", "w");
  if (f == nullptr) {
    std::perror("kernel_trace: cannot write the trace");
    return;
  }
  std::fprintf(f, "start_ns,end_ns,stream,graph_id,grid,block,registers,name\n");
  for (const KernelRecord& r : *g_records) {
    std::fprintf(f, "%llu,%llu,%u,%u,%d,%d,%u,%s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.stream, r.graph_id, r.grid, r.block,
                 r.registers, r.name.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "kernel_trace: %zu kernels written\n", g_records->size());
}

}  // namespace

// Called by the CUDA driver once, at initialisation, when CUDA_INJECTION64_PATH names this file.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  CUPTI_OR_DIE(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted));
  CUPTI_OR_DIE(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  std::atexit(WriteTrace);
  return 1;
}
