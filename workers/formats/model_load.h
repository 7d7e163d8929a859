// Model loading (workers/formats/model_load.cc, model_load_hf.cc): the file formats read into
// the engine's Model. Below the engine's users, above workers/engine/model.h: the engine itself
// includes no format.
#pragma once

#include <memory>
#include <string>

#include "workers/engine/model.h"

namespace kvb::engine {

// Loads a model: a directory is a Hugging Face checkpoint folder; a file's format is chosen by
// its magic bytes ("GGUF" or a llama2.c header). Throws kvb::Error naming the file and what is
// wrong (unsupported architecture lists the supported ones).
// native_blocks (--dtype native): a GGUF file's matrices and embedding of a type the quantized
// product takes are not dequantized (Model::native_blocks); other formats ignore it.
std::unique_ptr<Model> load_model(const std::string& path, bool native_blocks = false);
std::unique_ptr<Model> load_llama2c(const std::string& path);
std::unique_ptr<Model> load_gguf_model(const std::string& path, bool native_blocks = false);
std::unique_ptr<Model> load_hf_model(const std::string& dir);  // model_load_hf.cc

}  // namespace kvb::engine
