// router_fd_limit_server: the router's HttpServer in a process with few file descriptors, for
// fd_limit_test.cc. Lowers RLIMIT_NOFILE to (descriptors open now + --spare), serves /health on a
// free loopback port, prints the port on stdout and runs until stdin closes.
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "router/http_server.h"

namespace {

int OpenDescriptors() {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 64;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  const int spare = argc > 1 ? std::atoi(argv[1]) : 16;
  tandem::router::HttpServerOptions options;
  options.address = "127.0.0.1";
  options.port = 0;
  options.num_threads = 1;
  tandem::router::HttpServer server(options,
                                    [](tandem::router::HttpRequest request,
                                       std::shared_ptr<tandem::router::HttpResponder> responder) {
                                      responder->Send(request.path == "/health" ? 200 : 404,
                                                      "application/json", R"({"status": "ok"})");
                                    });
  if (!server.Start().ok()) return 1;
  // The I/O thread and the acceptor exist now; what is left is for connections.
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = static_cast<rlim_t>(OpenDescriptors() + spare);
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return 2;
  std::cout << server.port() << std::endl;
  char c;
  while (read(0, &c, 1) > 0) {
  }
  server.Stop();
  return 0;
}
