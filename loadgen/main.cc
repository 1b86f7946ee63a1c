// tandem-loadgen: see loadgen/README.md.
#include "loadgen/driver.h"
#include "loadgen/flags.h"

int main(int argc, char** argv) {
  tandem::loadgen::Config config;
  int code = tandem::loadgen::ParseFlags(argc, argv, &config);
  if (code >= 0) return code;
  return tandem::loadgen::RunLoadgen(config);
}
