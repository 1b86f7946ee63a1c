// The worker's metrics server in a process that loads libcublasLt at startup, as every worker
// built with the CUDA backend does. libcublasLt's large static TLS block is placed by glibc on
// every new thread's stack; CivetWeb (prometheus-cpp's Exposer) could then not create its
// threads, and a worker failed at startup. Needs no GPU: the library is only loaded.
#include <elf.h>
#include <link.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/http/http_connection.h"
#include "worker/worker_metrics.h"

namespace tandem {
namespace {

// The size of libcublasLt's PT_TLS segment; -1 if the library is not loaded.
int64_t LoadedCublasLtTlsBytes() {
  int64_t tls = -1;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name == nullptr || !absl::StrContains(info->dlpi_name, "libcublasLt")) {
          return 0;
        }
        int64_t& bytes = *static_cast<int64_t*>(out);
        bytes = 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_TLS) bytes = info->dlpi_phdr[i].p_memsz;
        }
        return 1;
      },
      &tls);
  return tls;
}

TEST(MetricsHttpServerCublasLtTest, ServesMetricsWithCublasLtLoaded) {
  const int64_t tls = LoadedCublasLtTlsBytes();
  ASSERT_GE(tls, 0) << "libcublasLt is not loaded: the test would prove nothing (check the "
                       "test's link options)";
  RecordProperty("cublaslt_static_tls_bytes", std::to_string(tls));

  absl::StatusOr<std::unique_ptr<WorkerMetrics>> m =
      WorkerMetrics::Create("127.0.0.1", 0, "decode", "decode-0", "tiny");
  ASSERT_TRUE(m.ok()) << m.status();
  (*m)->CountRequestOutcome("length");
  std::optional<testing::HttpResult> r = testing::HttpGetOnce((*m)->port(), "/metrics");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, ::testing::HasSubstr("finished_reason=\"length\""));
}

}  // namespace
}  // namespace tandem
