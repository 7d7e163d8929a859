// kvb_make_tp_model PATH [DIM HIDDEN_DIM]: writes the random-weight Llama-shaped GGUF (16 heads,
// 8 KV heads) of tests/tp_test_model.h, which configs/ci_tp.yaml expects at
// models/random-llama-8kv.gguf. DIM and HIDDEN_DIM change its widths (scripts/check_gguf_types.py
// needs rows of a multiple of 256, which llama.cpp's K-quants require).
#include <cstdio>
#include <cstdlib>

#include "tp_test_model.h"

int main(int argc, char** argv) {
  kvb::testing::RandomLlamaShape shape;
  if (argc == 4) {
    shape.dim = std::atoi(argv[2]);
    shape.hidden_dim = std::atoi(argv[3]);
  }
  if ((argc != 2 && argc != 4) || shape.dim <= 0 || shape.dim % shape.heads != 0 ||
      shape.hidden_dim <= 0) {
    std::fprintf(stderr,
                 "usage: kvb_make_tp_model PATH [DIM HIDDEN_DIM] (e.g. "
                 "models/random-llama-8kv.gguf; DIM a multiple of %d)\n",
                 shape.heads);
    return 2;
  }
  if (!kvb::testing::write_random_llama_gguf(argv[1], shape)) {
    std::fprintf(stderr, "kvb_make_tp_model: cannot write %s\n", argv[1]);
    return 1;
  }
  return 0;
}
