// kvbench: entry point. All logic lives in harness/cli.cc and the cmd_*.cc files.
#include "harness/cli.h"

int main(int argc, char** argv) { return kvb::harness::run_cli(argc, argv); }
