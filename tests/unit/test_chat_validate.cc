// `kvbench validate` and `kvbench inspect` on a model's own chat template, read from the file's
// header (harness/model_info.cc): a template that parses and renders one user turn is accepted;
// one that is not valid Jinja, or that refuses a lone user turn, makes validate refuse chat-wrapped
// tasks with the file, the reason and the way out (chat: false), while the same model runs tasks
// without chat. On a tiny zero-weight llama GGUF written here. validate also loads each model's
// tokenizer as the sweep does (issue 31): a corrupt one, one that is the model file, or one larger
// than the model's vocabulary is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gguf_writer.h"
#include "harness/model_info.h"
#include "run_kvbench.h"
#include "workers/tokenizer/unicode.h"

namespace kvb {
namespace {

std::string dir() {
  const std::string d =
      std::string(KVB_BINARY_DIR) + "/test_chat_validate_" + std::to_string(getpid());
  std::filesystem::create_directories(d);
  return d;
}

// A 1-layer llama (dim 8, 2 heads, vocab 300, context 512), zero weights, a byte-level BPE
// vocabulary of the 256 byte tokens (none with with_tokenizer false); template "" = none.
std::string write_model(const std::string& name, const std::string& chat_template,
                        bool with_tokenizer = true) {
  testing::GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", name);
  if (with_tokenizer) {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(tokenizer::unicode::byte_to_unicode()[b]);
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_string_array("tokenizer.ggml.merges", {});
  }
  using W = testing::GgufWriter;
  w.add_scalar<uint32_t>("llama.embedding_length", W::kU32, 8);
  w.add_scalar<uint32_t>("llama.feed_forward_length", W::kU32, 16);
  w.add_scalar<uint32_t>("llama.block_count", W::kU32, 1);
  w.add_scalar<uint32_t>("llama.attention.head_count", W::kU32, 2);
  w.add_scalar<uint32_t>("llama.attention.head_count_kv", W::kU32, 2);
  w.add_scalar<uint32_t>("llama.context_length", W::kU32, 512);
  w.add_scalar<float>("llama.attention.layer_norm_rms_epsilon", W::kF32, 1e-5f);
  if (!chat_template.empty()) w.add_string("tokenizer.chat_template", chat_template);
  auto zeros = [](uint64_t n) { return std::vector<uint8_t>(n * sizeof(float), 0); };
  const uint64_t D = 8, H = 16, V = 300;
  w.add_tensor("token_embd.weight", {D, V}, 0, zeros(D * V));
  for (const char* t : {"attn_norm", "ffn_norm"}) {
    w.add_tensor(std::string("blk.0.") + t + ".weight", {D}, 0, zeros(D));
  }
  for (const char* t : {"attn_q", "attn_k", "attn_v", "attn_output"}) {
    w.add_tensor(std::string("blk.0.") + t + ".weight", {D, D}, 0, zeros(D * D));
  }
  w.add_tensor("blk.0.ffn_gate.weight", {D, H}, 0, zeros(D * H));
  w.add_tensor("blk.0.ffn_up.weight", {D, H}, 0, zeros(D * H));
  w.add_tensor("blk.0.ffn_down.weight", {H, D}, 0, zeros(H * D));
  w.add_tensor("output_norm.weight", {D}, 0, zeros(D));
  w.add_tensor("output.weight", {D, V}, 0, zeros(D * V));
  const std::string path = dir() + "/" + name + ".gguf";
  EXPECT_TRUE(testing::GgufWriter::write_file(path, w.bytes()));
  return path;
}

// validate on a chat-wrapped NIAH task (chat: true is the task's default) or a plain one.
int validate(const std::string& model, bool chat, std::string* err,
             const std::string& tokenizer = "") {
  const std::string cfg = model + (chat ? ".chat.yaml" : ".plain.yaml");
  std::ofstream(cfg) << "models:\n  - name: tiny\n    path: " << model << "\n"
                     << (tokenizer.empty() ? "" : "    tokenizer: " + tokenizer + "\n")
                     << "tasks: [{name: niah, options: {context_lengths: [256], depths: [0]"
                     << (chat ? "" : ", chat: false") << "}}]\npolicies: [full]\n";
  std::string out;
  return testing::kvbench({"validate", cfg}, &out, err);
}

TEST(ChatValidate, GoodTemplateAccepted) {
  const std::string m =
      write_model("good",
                  "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                  "{% if add_generation_prompt %}<assistant>{% endif %}");
  const harness::ModelInfo info = harness::read_model_info(m);
  EXPECT_EQ(info.chat_template, "GGUF tokenizer.chat_template");
  EXPECT_EQ(info.chat_template_error, "");
  std::string err;
  EXPECT_EQ(validate(m, true, &err), 0) << err;
  std::string out;
  ASSERT_EQ(testing::kvbench({"inspect", m}, &out, &err), 0) << err;
  EXPECT_NE(out.find("| chat format kvbench renders | the model's own Jinja template (minja)"),
            std::string::npos)
      << out;
}

TEST(ChatValidate, BrokenOrRefusingTemplateRefusedForChatOnly) {
  const std::string broken = write_model("broken", "{% if messages %}never closed");
  const std::string refusing =
      write_model("refusing",
                  "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system message "
                  "required') }}{% endif %}{{ messages[0]['content'] }}");
  for (const auto& [m, why] : {std::pair<std::string, std::string>{broken, "not valid Jinja"},
                               {refusing, "system message required"}}) {
    const harness::ModelInfo info = harness::read_model_info(m);
    EXPECT_NE(info.chat_template_error.find(why), std::string::npos) << info.chat_template_error;
    std::string err;
    EXPECT_EQ(validate(m, true, &err), 2) << m;
    for (const std::string& part : {m, why, std::string("chat: false")}) {
      EXPECT_NE(err.find(part), std::string::npos) << part << " in: " << err;
    }
    EXPECT_EQ(validate(m, false, &err), 0) << err;
    std::string out;
    ASSERT_EQ(testing::kvbench({"inspect", m}, &out, &err), 0) << err;
    EXPECT_NE(out.find("| chat format kvbench renders | none: "), std::string::npos) << out;
  }
  // No template at all: the existing refusal.
  const std::string none = write_model("none", "");
  std::string err;
  EXPECT_EQ(validate(none, true, &err), 2);
  EXPECT_NE(err.find("has none kvbench recognizes"), std::string::npos) << err;
}

// Templates that crashed kvbench (SIGSEGV in inspect, validate, generate --chat and on every rank
// of a sweep) before renders ran in an isolated child under limits: now validate refuses the chat
// task naming the file and the limit, inspect says why chat is unavailable, generate --chat is a
// usage error, and a sweep that runs anyway records its chat units as `error` rows and goes on.
const char* const kRecursive[] = {
    "{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}",
    "{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n) }}{% endmacro %}{{ a(0) }}",
    "{% for x in messages recursive %}{{ loop(messages) }}{% endfor %}"};
const std::string kRecursionLimit = "exceeded the recursion depth limit";

TEST(ChatValidate, EndlessRecursionInAModelsTemplateIsRefusedNotACrash) {
  int i = 0;
  for (const char* tmpl : kRecursive) {
    SCOPED_TRACE(tmpl);
    const std::string m = write_model("recursive" + std::to_string(i++), tmpl);
    std::string out, err;
    EXPECT_EQ(validate(m, true, &err), 2);
    for (const std::string& part : {m + ": tokenizer.chat_template", kRecursionLimit,
                                    std::string("chat: false")}) {
      EXPECT_NE(err.find(part), std::string::npos) << part << " in: " << err;
    }
    EXPECT_EQ(validate(m, false, &err), 0) << err;
    ASSERT_EQ(testing::kvbench({"inspect", m}, &out, &err), 0) << err;
    EXPECT_NE(out.find("| chat format kvbench renders | none: " + m), std::string::npos) << out;
    EXPECT_NE(out.find(kRecursionLimit), std::string::npos) << out;
  }
}

// The same through a Hugging Face folder's tokenizer_config.json (a copy of a test checkpoint).
TEST(ChatValidate, HostileTemplateInAFoldersTokenizerConfig) {
  namespace fs = std::filesystem;
  const fs::path folder = fs::path(dir()) / "qwen2_hostile";
  fs::remove_all(folder);
  fs::copy(fs::path(KVB_FIXTURES_DIR) / "hf" / "qwen2_f16", folder, fs::copy_options::recursive);
  const fs::path tc = folder / "tokenizer_config.json";
  std::string text;
  {
    std::ifstream in(tc);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t at = text.find("\"chat_template\"");
  ASSERT_NE(at, std::string::npos);
  const size_t colon = text.find(':', at);
  const size_t q1 = text.find('"', colon);
  size_t q2 = q1 + 1;
  while (text[q2] != '"') q2 += text[q2] == '\\' ? 2 : 1;
  text.replace(q1, q2 - q1 + 1,
               "\"{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n) }}{% endmacro "
               "%}{{ a(0) }}\"");
  std::ofstream(tc) << text;
  std::string out, err;
  ASSERT_EQ(testing::kvbench({"inspect", folder.string()}, &out, &err), 0) << err;
  EXPECT_NE(out.find(kRecursionLimit), std::string::npos) << out;
  EXPECT_EQ(testing::kvbench({"generate", "--model", folder.string(), "--prompt", "hi", "--chat",
                              "-n", "1"},
                             &out, &err),
            2);
  EXPECT_NE(err.find(folder.string()), std::string::npos) << err;
  EXPECT_NE(err.find(kRecursionLimit), std::string::npos) << err;
  EXPECT_EQ(testing::kvbench({"generate", "--model", folder.string(), "--prompt", "hi", "-n", "1"},
                             &out, &err),
            0)
      << err;
  // A sweep that runs anyway (no validate first): the chat unit is an `error` row naming the
  // limit, the plain unit runs, and the sweep exits 1 (a unit failed) instead of dying.
  const std::string cfg = folder.string() + ".sweep.yaml";
  const std::string db = folder.string() + ".db";
  std::filesystem::remove(db);
  std::ofstream(cfg) << "models:\n  - name: tiny\n    path: " << folder.string() << "\n"
                     << "tasks:\n  - {name: niah, options: {context_lengths: [256], depths: [0]}}\n"
                     << "  - {name: niah, options: {context_lengths: [256], depths: [0], "
                        "chat: false}}\n"
                     << "policies: [full]\n";
  EXPECT_EQ(testing::kvbench({"sweep", cfg, "--db", db, "--threads", "1"}, &out, &err), 1) << err;
  ASSERT_EQ(testing::kvbench({"query", "--db", db,
                              "SELECT status, instr(coalesce(error, ''), 'exceeded the recursion "
                              "depth limit') > 0 AS hit FROM units ORDER BY status"},
                             &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("| error  |   1 |"), std::string::npos) << out;  // the chat unit
  EXPECT_NE(out.find("| ok     |   0 |"), std::string::npos) << out;  // the plain one ran
}

// What the sweep's coordinator would refuse at start (it loads each tokenizer to plan the units),
// validate refuses too, as a usage error naming the config, the model and the tokenizer.
TEST(ChatValidate, TokenizerIsLoadedAsTheSweepLoadsIt) {
  const std::string m = write_model("tok_ok", "");
  std::string err;
  EXPECT_EQ(validate(m, false, &err), 0) << err;
  // No vocabulary in the file and no tokenizer: given.
  const std::string bare = write_model("tok_none", "", false);
  EXPECT_EQ(validate(bare, false, &err), 2);
  EXPECT_NE(err.find(bare + ".plain.yaml: model 'tiny': tokenizer the model's own cannot be "
                            "loaded: "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(bare + ": metadata key 'tokenizer.ggml.model' not found"), std::string::npos)
      << err;
  // tokenizer: naming the model file itself (read as a llama2.c tokenizer.bin).
  EXPECT_EQ(validate(m, false, &err, m), 2);
  EXPECT_NE(err.find("model 'tiny': tokenizer '" + m + "' cannot be loaded: "), std::string::npos)
      << err;
  EXPECT_NE(err.find(m + ": bad max_token_length"), std::string::npos) << err;
  // A corrupt tokenizer.json, and one with more tokens than the model has rows.
  const std::string corrupt = dir() + "/corrupt.json";
  std::ofstream(corrupt) << "{\"model\": {\"type\": \"BPE\", \"vocab\": ";
  EXPECT_EQ(validate(m, false, &err, corrupt), 2);
  EXPECT_NE(err.find("tokenizer '" + corrupt + "' cannot be loaded: "), std::string::npos) << err;
  // Qwen3's tokenizer.json on this 300-row model: the worker's loader would refuse the pair.
  const std::string qwen3 = KVB_SHARED_DIR "/models/tokenizers/qwen3/tokenizer.json";
  if (std::filesystem::exists(qwen3)) {
    EXPECT_EQ(validate(m, false, &err, qwen3), 2);
    EXPECT_NE(err.find("model 'tiny': tokenizer '" + qwen3 +
                       "' has 151669 tokens but the model "
                       "only 300: wrong tokenizer: for " +
                       m + "?"),
              std::string::npos)
        << err;
  }
}

}  // namespace
}  // namespace kvb
