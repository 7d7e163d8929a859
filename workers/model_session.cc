// Model + tokenizer loading and prompt encoding for the CLI.
#include "workers/formats/model_load.h"
#include "workers/model_session.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "common/error.h"
#include "common/log.h"
#include "common/sha256.h"
#include "kernels/formats/file_io.h"
#include "workers/formats/gguf.h"
#include "workers/formats/hf_config.h"

namespace kvb::workers {

struct LoadedModel::FrameCache {
  std::mutex mu;
  std::map<std::string, ChatFrame> by_system;
};

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const std::string kSentinel = "\x01\x02kvbench-user-content\x02\x01";

// Parses the model's chat template `text` ("" if none; bos/eos: the texts of the vocabulary's BOS
// and EOS tokens); `origin` names where it came from in errors. A template that does not parse
// leaves lm.chat null and says why in lm.chat_error, so that the model still runs prompts
// without chat.
void set_chat_template(LoadedModel& lm, const std::string& text, const std::string& origin) {
  lm.chat_template = text;
  if (lm.chat_template.empty()) return;
  const tokenizer::Tokenizer& t = *lm.tokenizer;
  const std::string bos =
      t.bos_id() >= 0 && t.bos_id() < t.vocab_size() ? t.token_to_piece(t.bos_id()) : "";
  const std::string eos =
      t.eos_id() >= 0 && t.eos_id() < t.vocab_size() ? t.token_to_piece(t.eos_id()) : "";
  try {
    lm.chat = std::make_shared<const tokenizer::JinjaChatTemplate>(
        lm.chat_template, bos, eos, origin);
    lm.chat_frames = std::make_shared<LoadedModel::FrameCache>();
  } catch (const Error& e) {
    lm.chat_error = e.what();
    return;
  }
  try {
    const std::string probe = lm.chat->render({{"user", kSentinel}}, true);
    lm.chat_writes_bos = !bos.empty() && probe.compare(0, bos.size(), bos) == 0;
    // The probe is chat_frame(lm, "")'s render: keep its frame (one render per load).
    const size_t at = probe.find(kSentinel);
    if (at != std::string::npos && probe.find(kSentinel, at + 1) == std::string::npos) {
      lm.chat_frames->by_system.emplace(
          "", ChatFrame{probe.substr(0, at), probe.substr(at + kSentinel.size())});
    }
  } catch (const Error&) {
    // A template that refuses a lone user message: chat_frame reports it where it is used.
  }
}

// A Hugging Face checkpoint folder's tokenizer (its tokenizer.json unless --tokenizer names
// another) and prompt conventions from tokenizer_config.json: BOS when add_bos_token says so,
// the chat template (tokenizer_config.json or chat_template.jinja), end ids from eos_token and
// the turn-ending special tokens. vocab_size: the model's, for a llama2.c tokenizer.bin.
void load_hf_folder_tokenizer(LoadedModel& lm, const std::string& dir,
                              const std::string& tokenizer_path, int32_t vocab_size) {
  // Validated first: the tokenizer.json loader reads the same file's bos/eos/add_bos_token.
  const engine::HfTokenizerConfig tc = engine::read_hf_tokenizer_config(dir);
  const std::string own = (std::filesystem::path(dir) / "tokenizer.json").string();
  std::error_code ec;
  if (!tokenizer_path.empty() && !ends_with(tokenizer_path, ".json")) {
    lm.tokenizer = tokenizer::load_llama2c_tokenizer(tokenizer_path, vocab_size);
  } else {
    const std::string path = tokenizer_path.empty() ? own : tokenizer_path;
    KVB_USAGE_CHECK(std::filesystem::is_regular_file(path, ec))
        << dir << " has no tokenizer.json: pass --tokenizer PATH (a tokenizer.json)";
    lm.tokenizer = tokenizer::load_hf_tokenizer_json(path);
  }
  lm.add_bos = lm.tokenizer->default_add_bos();
  set_chat_template(lm, tc.chat_template,
                    dir + ": the chat template (tokenizer_config.json or chat_template.jinja)");
  lm.end_ids = lm.tokenizer->end_ids();
}
}  // namespace

LoadedModel load_model_and_tokenizer(const std::string& model_path,
                                     const std::string& tokenizer_path, bool native_blocks) {
  KVB_USAGE_CHECK(!model_path.empty())
      << "--model is required (a .gguf file, a llama2.c .bin or a Hugging Face checkpoint folder)";
  std::error_code ec;
  KVB_USAGE_CHECK(!std::filesystem::is_directory(model_path, ec) ||
                  std::filesystem::exists(std::filesystem::path(model_path) / "config.json", ec))
      << "model '" << model_path << "' is a directory without config.json; give a model file "
      << "(.gguf or .bin) or a Hugging Face checkpoint folder";
  KVB_USAGE_CHECK(tokenizer_path.empty() || !std::filesystem::is_directory(tokenizer_path, ec))
      << "tokenizer '" << tokenizer_path << "' is a directory; give the tokenizer file in it";
  LoadedModel lm;
  lm.path = model_path;
  lm.model = engine::load_model(model_path, native_blocks);
  const engine::ModelConfig& c = lm.model->config;
  if (c.format == "hf") {
    load_hf_folder_tokenizer(lm, model_path, tokenizer_path, c.vocab_size);
  } else if (!tokenizer_path.empty()) {
    if (ends_with(tokenizer_path, ".json")) {
      lm.tokenizer = tokenizer::load_hf_tokenizer_json(tokenizer_path);
    } else {
      lm.tokenizer = tokenizer::load_llama2c_tokenizer(tokenizer_path, c.vocab_size);
    }
  } else {
    KVB_USAGE_CHECK(lm.model->gguf != nullptr)
        << model_path << " is a llama2.c checkpoint, which carries no tokenizer: pass "
        << "--tokenizer PATH (its tokenizer.bin, e.g. ../shared/models/stories260K/tok512.bin)";
    lm.tokenizer = tokenizer::load_gguf_tokenizer(*lm.model->gguf);
  }
  KVB_USAGE_CHECK(lm.tokenizer->vocab_size() <= c.vocab_size)
      << "tokenizer has " << lm.tokenizer->vocab_size() << " tokens but the model only "
      << c.vocab_size << ": wrong --tokenizer for " << model_path << "?";
  // A model may have more logits rows than the tokenizer has tokens (padded vocabularies): ids
  // sampled there decode to "" with a warning rather than failing the unit.
  lm.tokenizer = tokenizer::pad_vocabulary(std::move(lm.tokenizer), c.vocab_size);
  if (c.format == "hf") {
    // Conventions set by load_hf_folder_tokenizer.
  } else if (lm.model->gguf) {
    const formats::GgufFile& g = *lm.model->gguf;
    lm.add_bos = g.get_int_or("tokenizer.ggml.add_bos_token", 0) != 0;
    set_chat_template(lm, g.get_string_or("tokenizer.chat_template", ""),
                      model_path + ": tokenizer.chat_template");
    lm.end_ids = lm.tokenizer->end_ids();
  } else {
    // llama2.c models: prompts start with BOS and generation stops on BOS, as run.c does.
    lm.add_bos = true;
    lm.end_ids = {lm.tokenizer->bos_id() >= 0 ? lm.tokenizer->bos_id() : 1};
  }
  KVB_LOG_DEBUG << "model " << c.name << " (" << c.arch << ", " << c.num_layers << " layers, dim "
                << c.dim << ", " << c.num_heads << "/" << c.num_kv_heads << " heads, vocab "
                << c.vocab_size << ", " << lm.model->num_parameters() << " parameters), chat "
                << "template "
                << (lm.chat                    ? "yes"
                    : lm.chat_template.empty() ? "none"
                                               : "invalid");
  return lm;
}

LoadedModel load_tokenizer_only(const std::string& model_path, const std::string& tokenizer_path) {
  LoadedModel lm;
  lm.path = model_path;
  std::error_code ec;
  if (std::filesystem::is_directory(model_path, ec)) {
    int32_t vocab = 0;
    if (!tokenizer_path.empty() && !ends_with(tokenizer_path, ".json")) {
      vocab = engine::read_hf_config(model_path, *formats::SafetensorsSet::open_dir(model_path))
                  .vocab_size;
    }
    load_hf_folder_tokenizer(lm, model_path, tokenizer_path, vocab);
    return lm;
  }
  formats::regular_file_size(model_path, "model file");  // a FIFO would block the open below
  std::ifstream in(model_path, std::ios::binary);
  KVB_USAGE_CHECK(in.good()) << "cannot open model file '" << model_path << "'";
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  const bool gguf = in.gcount() == 4 && std::string(magic, 4) == "GGUF";
  if (!tokenizer_path.empty()) {
    if (tokenizer_path.size() > 5 &&
        tokenizer_path.compare(tokenizer_path.size() - 5, 5, ".json") == 0) {
      lm.tokenizer = tokenizer::load_hf_tokenizer_json(tokenizer_path);
    } else if (gguf) {
      // A llama2.c tokenizer.bin for a GGUF model (e.g. a test model without tokenizer
      // metadata): the vocabulary size is the embedding's second dimension.
      std::shared_ptr<formats::GgufFile> g = formats::GgufFile::open(model_path);
      const formats::GgufTensorInfo* emb = g->find_tensor("token_embd.weight");
      KVB_CHECK(emb && emb->dims.size() == 2)
          << model_path << ": tensor token_embd.weight missing or not 2-D";
      lm.tokenizer = tokenizer::load_llama2c_tokenizer(tokenizer_path,
                                                       static_cast<int32_t>(emb->dims[1]));
    } else {
      // llama2.c: the vocabulary size is the checkpoint header's 6th int32 (sign: tied classifier).
      int32_t hdr[7] = {0, 0, 0, 0, 0, 0, 0};
      in.seekg(0);
      in.read(reinterpret_cast<char*>(hdr), sizeof(hdr));
      KVB_CHECK(in.gcount() == sizeof(hdr)) << model_path << ": truncated llama2.c header";
      const int64_t vocab = hdr[5] < 0 ? -static_cast<int64_t>(hdr[5]) : hdr[5];
      KVB_CHECK(vocab > 0 && vocab < (1 << 22)) << model_path << ": bad vocab_size " << hdr[5];
      lm.tokenizer = tokenizer::load_llama2c_tokenizer(tokenizer_path, static_cast<int32_t>(vocab));
    }
  }
  if (gguf) {
    std::shared_ptr<formats::GgufFile> g = formats::GgufFile::open(model_path);
    if (!lm.tokenizer) lm.tokenizer = tokenizer::load_gguf_tokenizer(*g);
    lm.add_bos = g->get_int_or("tokenizer.ggml.add_bos_token", 0) != 0;
    set_chat_template(lm, g->get_string_or("tokenizer.chat_template", ""),
                      model_path + ": tokenizer.chat_template");
    lm.end_ids = lm.tokenizer->end_ids();
  } else {
    KVB_USAGE_CHECK(lm.tokenizer != nullptr)
        << model_path << " is a llama2.c checkpoint, which carries no tokenizer: give its "
        << "tokenizer.bin";
    lm.add_bos = true;
    lm.end_ids = {lm.tokenizer->bos_id() >= 0 ? lm.tokenizer->bos_id() : 1};
  }
  return lm;
}

ChatFrame chat_frame(const LoadedModel& lm, const std::string& system) {
  std::unique_lock<std::mutex> lock;
  if (lm.chat_frames) {
    lock = std::unique_lock<std::mutex>(lm.chat_frames->mu);
    const auto it = lm.chat_frames->by_system.find(system);
    if (it != lm.chat_frames->by_system.end()) return it->second;
  }
  KVB_USAGE_CHECK(lm.chat != nullptr)
      << (lm.chat_error.empty()
              ? lm.path +
                    ": the model has no chat template (no tokenizer.chat_template; a base "
                    "model has none): run without chat, or use an instruction-tuned model"
              : lm.chat_error + " (run without chat)");
  // Render with a sentinel as the user message and split around it, so that the template's
  // markers are parsed as special tokens and the user's text never is.
  std::vector<tokenizer::ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", kSentinel});
  const std::string text = lm.chat->render(messages, true);
  const size_t at = text.find(kSentinel);
  KVB_USAGE_CHECK(at != std::string::npos && text.find(kSentinel, at + 1) == std::string::npos)
      << lm.chat->origin() << ": the chat template does not render the user message exactly once, "
      << "so kvbench cannot place the prompt in it";
  ChatFrame frame{text.substr(0, at), text.substr(at + kSentinel.size())};
  if (lm.chat_frames) lm.chat_frames->by_system.emplace(system, frame);
  return frame;
}

std::vector<int32_t> encode_text(const LoadedModel& lm, const std::string& text, bool special,
                                 bool bos) {
  tokenizer::EncodeOptions opt;
  opt.add_bos = bos;
  opt.parse_special = special;
  return lm.tokenizer->encode(text, opt);
}

policies::ReplayPrompt replay_prompt(const LoadedModel& lm, int prefix,
                                     const std::vector<int32_t>& tail) {
  policies::ReplayPrompt p;
  p.prefix = prefix;
  p.first = encode_text(lm, "\n\nRepeat the previous context exactly.", false, false);
  p.next = encode_text(
      lm, "\n\nRepeat the part of the previous context exactly, starting with", false, false);
  p.suffix = tail.empty() ? encode_text(lm, "\n", false, false) : tail;
  return p;
}

bool prompt_needs_bos(const LoadedModel& lm, bool chat) {
  // Llama-3 and Gemma templates write their BOS text literally; do not add a second one.
  return lm.add_bos && (!chat || !lm.chat_writes_bos);
}

std::vector<int32_t> encode_prompt(const LoadedModel& lm, const std::string& prompt, bool chat,
                                   const std::string& system) {
  if (!chat) return encode_text(lm, prompt, false, prompt_needs_bos(lm, false));
  const ChatFrame frame = chat_frame(lm, system);
  std::vector<int32_t> ids = encode_text(lm, frame.prefix, true, prompt_needs_bos(lm, true));
  for (int32_t id : encode_text(lm, prompt, false, false)) ids.push_back(id);
  for (int32_t id : encode_text(lm, frame.suffix, true, false)) ids.push_back(id);
  return ids;
}

std::string token_ids_sha256(std::initializer_list<const std::vector<int32_t>*> parts) {
  Sha256 h;
  for (const std::vector<int32_t>* ids : parts) {
    for (int32_t id : *ids) {
      const uint32_t u = static_cast<uint32_t>(id);
      const uint8_t le[4] = {static_cast<uint8_t>(u), static_cast<uint8_t>(u >> 8),
                             static_cast<uint8_t>(u >> 16), static_cast<uint8_t>(u >> 24)};
      h.update(le, 4);
    }
  }
  return h.hex_digest();
}

policies::PolicyOptions parse_policy_options(const std::vector<std::string>& entries) {
  return Options::from_key_values(entries, "--policy-opt", "policy option");
}

}  // namespace kvb::workers
