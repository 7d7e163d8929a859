// kvb_make_tp_model PATH: writes the random-weight Llama-shaped GGUF (16 heads, 8 KV heads) of
// tests/tp_test_model.h, which configs/ci_tp.yaml expects at models/random-llama-8kv.gguf.
#include <cstdio>

#include "tp_test_model.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kvb_make_tp_model PATH (e.g. models/random-llama-8kv.gguf)\n");
    return 2;
  }
  if (!kvb::testing::write_random_llama_gguf(argv[1])) {
    std::fprintf(stderr, "kvb_make_tp_model: cannot write %s\n", argv[1]);
    return 1;
  }
  return 0;
}
