// router_fake_worker: a FakeWorker as a process, for the OpenAI client test (and for trying the
// router by hand without an engine). Registers with --router and serves until SIGTERM/SIGINT.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "tests/router/fake_worker.h"

int main(int argc, char** argv) {
  tandem::router::testing::FakeWorkerOptions options;
  std::string router = "127.0.0.1:8001";
  std::string role = "mixed";
  CLI::App app{"router_fake_worker: a fake tandem worker for router tests"};
  app.add_option("--router", router, "router gRPC address");
  app.add_option("--id", options.id, "worker id");
  app.add_option("--role", role, "prefill | decode | mixed");
  app.add_option("--text", options.text, "the text it generates");
  app.add_option("--token-delay-ms", options.token_delay_ms, "delay per token");
  CLI11_PARSE(app, argc, argv);
  if (const char* token = std::getenv("TANDEM_CLUSTER_TOKEN")) options.cluster_token = token;
  options.role = role == "prefill"  ? tandem::v1::WORKER_ROLE_PREFILL
                 : role == "decode" ? tandem::v1::WORKER_ROLE_DECODE
                                    : tandem::v1::WORKER_ROLE_MIXED;
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  tandem::router::testing::FakeWorker worker(options);
  absl::Status status = worker.Start(router);
  if (!status.ok()) {
    std::fprintf(stderr, "router_fake_worker: %s\n", status.ToString().c_str());
    return 1;
  }
  int received = 0;
  sigwait(&signals, &received);
  return 0;
}
