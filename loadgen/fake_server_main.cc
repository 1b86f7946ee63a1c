// tandem-loadgen-fake-server: the scripted streaming server of fake_server.h as a process, for
// measuring the loadgen's own ceiling (see loadgen/README.md) and for trying the loadgen out.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>

#include "loadgen/fake_server.h"

int main(int argc, char** argv) {
  tandem::loadgen::FakeServerOptions options;
  double ttft_ms = 0, itl_ms = 0;
  int tokens_per_chunk = 1, num_tokens = -1;
  CLI::App app{"tandem-loadgen-fake-server: scripted OpenAI-compatible streaming server"};
  app.add_option("--host", options.host);
  app.add_option("--port", options.port, "0 picks a free port");
  app.add_option("--threads", options.threads);
  app.add_option("--slots", options.slots, "requests served at a time (0: unlimited)");
  app.add_option("--ttft-ms", ttft_ms);
  app.add_option("--itl-ms", itl_ms);
  app.add_option("--tokens-per-chunk", tokens_per_chunk);
  app.add_option("--num-tokens", num_tokens, "-1: the request's max_tokens");
  try {  // CLI11 reports errors by throwing; converted here
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  options.script = [=](const tandem::loadgen::FakeRequest&) {
    tandem::loadgen::FakeResponse r;
    r.ttft_ms = ttft_ms;
    r.itl_ms = {itl_ms};
    r.tokens_per_chunk = tokens_per_chunk;
    r.num_tokens = num_tokens;
    return r;
  };
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // server threads inherit the mask
  tandem::loadgen::FakeServer server(options);
  auto port = server.Start();
  if (!port.ok()) {
    std::fprintf(stderr, "%s\n", port.status().ToString().c_str());
    return 1;
  }
  std::printf("listening on http://%s:%d\n", options.host.c_str(), *port);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&signals, &sig);
  server.Stop();
  std::printf("served %d requests\n", server.requests_served());
  return 0;
}
