// Tokenizers against reference token ids (tests/fixtures/tokenizer/*.json, written by
// scripts/make_tokenizer_fixture.py from HF tokenizers, sentencepiece and llama2.c's run.c rule),
// decode/encode round trips, special-token parsing, end ids, and the loaders' error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer_gguf_writer.h"
#include "workers/formats/gguf.h"
#include "workers/tokenizer/tokenizer.h"
#include "workers/tokenizer/tokenizer_impl.h"
#include "workers/tokenizer/unicode.h"

namespace kvb::tokenizer {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kShared = KVB_SHARED_DIR "/models";
const std::string kSmolLM2 = KVB_MODELS_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kQwen3 = kShared + "/tokenizers/qwen3/tokenizer.json";
const std::string kLlama2Bin = kShared + "/tokenizers/llama2_sp32k/tokenizer.bin";
const std::string kTok512 = kShared + "/stories260K/tok512.bin";

json fixture(const std::string& name) {
  std::ifstream in(std::string(KVB_FIXTURES_DIR) + "/tokenizer/" + name);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  return json::parse(in);
}

std::string temp_path(const std::string& name) {
  return (fs::path(::testing::TempDir()) / name).string();
}

// Expects message to contain every one of parts.
template <typename F>
void expect_error(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "expected kvb::Error";
  } catch (const kvb::Error& e) {
    for (const char* p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "': " << e.what();
    }
    std::printf("error as expected: %s\n", e.what());
  }
}

// Every case's ids equal the reference; returns the number of cases checked.
size_t expect_cases(const Tokenizer& tok, const json& cases, const EncodeOptions& opt) {
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text, opt), want) << "text: " << text.substr(0, 80);
  }
  return cases.size();
}

// ---- SmolLM2 (GGUF gpt2, pre "smollm") -------------------------------------------------------

class SmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kSmolLM2)) return;
    gguf_ = formats::GgufFile::open(kSmolLM2).release();
    tok_ = load_gguf_tokenizer(*gguf_).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete gguf_;
  }
  void SetUp() override {
    if (tok_ == nullptr) GTEST_SKIP() << kSmolLM2 << " not present (scripts/fetch_models.sh)";
  }
  static formats::GgufFile* gguf_;
  static Tokenizer* tok_;
};
formats::GgufFile* SmolLM2::gguf_ = nullptr;
Tokenizer* SmolLM2::tok_ = nullptr;

TEST_F(SmolLM2, MatchesHfTokenizers) {
  const json f = fixture("smollm2_gguf.json");
  EXPECT_GE(expect_cases(*tok_, f["cases"], {}), 20u);
  // Bytes whose symbol is missing from the vocabulary become <unk> (id 0).
  EXPECT_EQ(expect_cases(*tok_, f["unk_cases"], {}), 2u);
  EXPECT_EQ(tok_->vocab_size(), 49152);
}

TEST_F(SmolLM2, RoundTrips) {
  for (const auto& c : fixture("smollm2_gguf.json")["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok_->decode(tok_->encode(text, {})), text);
  }
  // Byte-level BPE covers any bytes, including invalid UTF-8.
  const std::string bytes = "\xc3 abc \x80\x80 end\xe2\x82";
  EXPECT_EQ(tok_->decode(tok_->encode(bytes, {})), bytes);
  std::string pieces;
  for (int32_t id : tok_->encode("héllo wörld", {})) pieces += tok_->token_to_piece(id);
  EXPECT_EQ(pieces, "héllo wörld");
}

TEST_F(SmolLM2, SpecialTokensAndEndIds) {
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_TRUE(tok_->is_end(2));
  EXPECT_NE(std::find(tok_->end_ids().begin(), tok_->end_ids().end(), 2), tok_->end_ids().end());
  EXPECT_FALSE(tok_->default_add_bos());
  EXPECT_EQ(tok_->find_token("<|im_start|>"), 1);
  EXPECT_TRUE(tok_->is_special(1));
  EXPECT_FALSE(tok_->is_special(tok_->find_token("hello")));
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const auto with = tok_->encode(text, {.add_bos = false, .parse_special = true});
  ASSERT_GE(with.size(), 3u);
  EXPECT_EQ(with.front(), 1);
  EXPECT_EQ(with.back(), 2);
  const auto without = tok_->encode(text, {.add_bos = false, .parse_special = false});
  EXPECT_EQ(std::count(without.begin(), without.end(), 1), 0);
  EXPECT_EQ(std::count(without.begin(), without.end(), 2), 0);
  EXPECT_EQ(tok_->decode(without), text);
  EXPECT_EQ(tok_->decode(with, /*skip_special=*/true), "user\nhi");
  const auto bos = tok_->encode("hi", {.add_bos = true});
  EXPECT_EQ(bos.front(), 1);
}

TEST_F(SmolLM2, ChatPromptIdsMatchTransformers) {
  const json f = fixture("smollm2_gguf.json");
  const std::string tmpl = gguf_->get_string("tokenizer.chat_template");
  ASSERT_EQ(detect_chat_format(tmpl), ChatFormat::kChatML);
  const std::string prompt =
      apply_chat_template(ChatFormat::kChatML, {{"user", "What is the capital of France?"}}, true,
                          chat_default_system(tmpl));
  EXPECT_EQ(prompt, f["chat_renders"][0]["text"].get<std::string>());
  EXPECT_EQ(tok_->encode(prompt, {}), f["chat_render_ids"].get<std::vector<int32_t>>());
}

TEST_F(SmolLM2, LongText) {
  const std::string para = fixture("smollm2_gguf.json")["cases"].back()["text"];
  std::string text;
  while (text.size() < 100000) text += para + "\n" + std::to_string(text.size()) + " ";
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok_->encode(text, {});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("encoded %zu chars into %zu tokens in %.3f s\n", text.size(), ids.size(), s);
  EXPECT_EQ(tok_->decode(ids), text);
}

// ---- Qwen3 tokenizer.json ----------------------------------------------------------------------

TEST(Qwen3Json, MatchesHfTokenizersAndRoundTrips) {
  if (!fs::exists(kQwen3)) GTEST_SKIP() << kQwen3 << " not present";
  const auto tok = load_hf_tokenizer_json(kQwen3);
  const json cases = fixture("qwen3_hf.json")["cases"];
  EXPECT_GE(expect_cases(*tok, cases, {}), 20u);
  bool saw_nfc_change = false;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const std::string nfc = unicode::nfc(text);
    saw_nfc_change |= nfc != text;
    EXPECT_EQ(tok->decode(tok->encode(text, {})), nfc);  // the normalizer is NFC
  }
  EXPECT_TRUE(saw_nfc_change) << "no fixture text exercises NFC";
  EXPECT_EQ(tok->vocab_size(), 151669);
  EXPECT_EQ(tok->eos_id(), tok->find_token("<|im_end|>"));
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_TRUE(tok->is_end(151645));
  EXPECT_TRUE(tok->is_end(151643));
  // <think> is a non-special added token: parsed even without parse_special; <|im_start|> is not.
  const auto ids = tok->encode("<|im_start|><think>", {.add_bos = false, .parse_special = false});
  EXPECT_EQ(ids.back(), 151667);
  EXPECT_NE(ids.front(), 151644);
  EXPECT_FALSE(tok->is_special(151667));
  EXPECT_TRUE(tok->is_special(151644));
  EXPECT_EQ(tok->decode({151644, 151667}, /*skip_special=*/true), "<think>");
}

TEST(Qwen3Json, NfcMatchesKnownCompositions) {
  EXPECT_EQ(unicode::nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(unicode::nfc("o\u0323\u0302"), "\u1ed9");       // reordered by class, then composed
  EXPECT_EQ(unicode::nfc("\u1100\u1161\u11a8"), "\uac01");  // Hangul L+V+T
  EXPECT_EQ(unicode::nfc("\u212b"), "\u00c5");              // singleton decomposition
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
}

// ---- llama2.c tokenizer.bin ---------------------------------------------------------------------

// Pieces and scores of a llama2.c tokenizer.bin (for building the GGUF below).
void read_llama2c(const std::string& path, std::vector<std::string>& pieces,
                  std::vector<float>& scores) {
  std::ifstream in(path, std::ios::binary);
  int32_t max_len = 0, len = 0;
  float score = 0;
  in.read(reinterpret_cast<char*>(&max_len), 4);
  while (in.read(reinterpret_cast<char*>(&score), 4) && in.read(reinterpret_cast<char*>(&len), 4)) {
    std::string p(len, '\0');
    in.read(p.data(), len);
    pieces.push_back(p);
    scores.push_back(score);
  }
}

TEST(Llama2cTokenizer, Llama2VocabMatchesReference) {
  if (!fs::exists(kLlama2Bin)) GTEST_SKIP() << kLlama2Bin << " not present";
  const auto tok = load_llama2c_tokenizer(kLlama2Bin, 32000);
  const json f = fixture("llama2c_32k.json");
  EXPECT_GE(expect_cases(*tok, f["cases"], {}), 20u);
  expect_cases(*tok, f["runc_only_cases"], {});
  for (const auto& c : f["cases"]) {
    const std::string text = c["text"];
    auto ids = tok->encode(text, {.add_bos = true});
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), text);
    ids.erase(ids.begin());
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(tok->decode(ids), text);
  }
  EXPECT_TRUE(tok->default_add_bos());
  EXPECT_EQ(tok->end_ids(), std::vector<int32_t>{2});
}

TEST(Llama2cTokenizer, Stories260KPrompts) {
  if (!fs::exists(kTok512)) GTEST_SKIP() << kTok512 << " not present";
  const auto tok = load_llama2c_tokenizer(kTok512, 512);
  EXPECT_EQ(expect_cases(*tok, fixture("stories260k_tok512.json")["cases"], {.add_bos = true}), 6u);
  // Hand-checked: " Once" 403, " upon" 407, " a" 261, " time" 378.
  EXPECT_EQ(tok->encode("Once upon a time", {.add_bos = true}),
            (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok->token_to_piece(403), " Once");
  EXPECT_EQ(tok->token_to_piece_after(1, 403), "Once");  // run.c strips the space after BOS
  EXPECT_EQ(tok->token_to_piece_after(403, 407), " upon");
  EXPECT_EQ(tok->decode({1, 403, 407, 261, 378}, true), "Once upon a time");
  EXPECT_EQ(tok->token_to_piece(3 + 0xF0), "\xF0");  // <0xF0> byte token
  EXPECT_EQ(tok->decode(tok->encode("Café 🍕", {})), "Café 🍕");
}

TEST(Llama2cTokenizer, ValidationErrors) {
  if (!fs::exists(kTok512)) GTEST_SKIP() << kTok512 << " not present";
  std::ifstream in(kTok512, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = temp_path("tok512_truncated.bin");
  std::ofstream(cut, std::ios::binary).write(data.data(), 1000);
  expect_error([&] { load_llama2c_tokenizer(cut, 512); },
               {"tok512_truncated.bin", "truncated", "offset"});
  std::ofstream(cut, std::ios::binary).write(data.data(), 2);
  expect_error([&] { load_llama2c_tokenizer(cut, 512); }, {"truncated", "offset 0"});
  expect_error([&] { load_llama2c_tokenizer(kTok512, 500); }, {"tok512.bin", "vocab_size 500"});
  expect_error([&] { load_llama2c_tokenizer(kTok512, 600); }, {"token 512", "offset"});
  expect_error([&] { load_llama2c_tokenizer(temp_path("no_such_file.bin"), 512); },
               {"no_such_file.bin"});
}

// ---- GGUF "llama" (SentencePiece-style) vocabulary, built from llama2 tokenizer.bin ------------

// A metadata-only GGUF with the llama2 vocabulary: U+2581 for spaces, <s> </s> control, byte
// tokens type 6, <unk> type 2.
testing::GgufMetadataWriter llama_vocab_gguf() {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  read_llama2c(kLlama2Bin, pieces, scores);
  std::vector<int32_t> types(pieces.size(), 1);
  types[0] = 2;
  pieces[1] = "<s>";
  pieces[2] = "</s>";
  types[1] = types[2] = 3;
  for (size_t i = 3; i < 259; ++i) types[i] = 6;
  for (size_t i = 259; i < pieces.size(); ++i) {
    std::string p;
    for (char c : pieces[i]) p += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
    pieces[i] = p;
  }
  testing::GgufMetadataWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", pieces);
  w.add_f32_array("tokenizer.ggml.scores", scores);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_bool("tokenizer.ggml.add_space_prefix", true);
  return w;
}

TEST(GgufSpmTokenizer, MatchesSentencePiece) {
  if (!fs::exists(kLlama2Bin)) GTEST_SKIP() << kLlama2Bin << " not present";
  const std::string path = temp_path("llama2_vocab.gguf");
  ASSERT_TRUE(llama_vocab_gguf().write(path));
  const auto gguf = formats::GgufFile::open(path);
  const auto tok = load_gguf_tokenizer(*gguf);
  const json cases = fixture("llama2_spm.json")["cases"];
  EXPECT_GE(expect_cases(*tok, cases, {}), 20u);
  for (const auto& c : cases) {
    const std::string text = c["text"];
    EXPECT_EQ(tok->decode(tok->encode(text, {})), text);
    EXPECT_EQ(tok->decode(tok->encode(text, {.add_bos = true}), true), text);
  }
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_TRUE(tok->is_end(2));
  EXPECT_TRUE(tok->default_add_bos());
  EXPECT_EQ(tok->encode("<s>", {.add_bos = false, .parse_special = true}), std::vector<int32_t>{1});
  EXPECT_EQ(tok->token_to_piece(tok->find_token("<0x0A>")), "\n");
}

// ---- GGUF loader errors
// --------------------------------------------------------------------------

testing::GgufMetadataWriter tiny_bpe_gguf(const std::string& model, const std::string& pre) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(unicode::byte_to_unicode()[b]);
  tokens.push_back("ab");
  testing::GgufMetadataWriter w;
  w.add_string("tokenizer.ggml.model", model);
  w.add_string("tokenizer.ggml.pre", pre);
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_string_array("tokenizer.ggml.merges", {"a b"});
  return w;
}

TEST(GgufTokenizer, LoaderErrorsNameWhatIsSupported) {
  const std::string bert = temp_path("bert_vocab.gguf");
  ASSERT_TRUE(tiny_bpe_gguf("bert", "default").write(bert));
  expect_error([&] { load_gguf_tokenizer(*formats::GgufFile::open(bert)); },
               {"bert_vocab.gguf", "'bert'", "supported: gpt2, llama"});
  const std::string pre = temp_path("unknown_pre.gguf");
  ASSERT_TRUE(tiny_bpe_gguf("gpt2", "no-such-pre").write(pre));
  expect_error([&] { load_gguf_tokenizer(*formats::GgufFile::open(pre)); },
               {"no-such-pre", "smollm", "qwen2", "llama3", "gpt2"});
  // And a tiny valid one: "ab" merges, "abc" -> [ab, c].
  const std::string ok = temp_path("tiny_bpe.gguf");
  ASSERT_TRUE(tiny_bpe_gguf("gpt2", "gpt2").write(ok));
  const auto tok = load_gguf_tokenizer(*formats::GgufFile::open(ok));
  EXPECT_EQ(tok->encode("abc", {}), (std::vector<int32_t>{256, 'c'}));
}

// ---- Pre-tokenizer regexes
// ------------------------------------------------------------------------

std::vector<std::string> pre_split(const std::string& pre, const std::string& text) {
  const RegexSplitter splitter(pre_tokenizer_spec(pre, "test").patterns);
  std::vector<std::string> out;
  for (auto piece : splitter.split(text)) out.emplace_back(piece);
  return out;
}

TEST(PreTokenizer, SplitsAsHfTokenizers) {
  // Expected pieces from tokenizers 0.20.3 pre_tokenizers.Split(Regex(<HF form of the pattern>),
  // "isolated"), for smollm preceded by Split(\p{N}).
  const std::string text = "Hello 12345 world!!\n\n  I'LL don't\t\tx  ";
  using V = std::vector<std::string>;
  EXPECT_EQ(pre_split("llama3", text), (V{"Hello", " ", "123", "45", " world", "!!\n\n", " ", " I",
                                          "'LL", " don", "'t", "\t", "\tx", "  "}));
  EXPECT_EQ(pre_split("qwen2", text), (V{"Hello", " ", "1", "2", "3", "4", "5", " world", "!!\n\n",
                                         " ", " I", "'LL", " don", "'t", "\t", "\tx", "  "}));
  EXPECT_EQ(pre_split("gpt2", text), (V{"Hello", " 12345", " world", "!!", "\n\n ", " I", "'", "LL",
                                        " don", "'t", "\t", "\t", "x", "  "}));
  EXPECT_EQ(pre_split("smollm", text),
            (V{"Hello", " ", "1", "2", "3", "4", "5", " world", "!!", "\n\n ", " I", "'", "LL",
               " don", "'t", "\t", "\t", "x", "  "}));
  // Invalid UTF-8 bytes become their own pieces instead of reaching PCRE2.
  EXPECT_EQ(pre_split("gpt2", "ab\xff cd"), (V{"ab", "\xff", " cd"}));
  for (const auto& name : supported_pre_tokenizers()) {
    std::string joined;
    for (const auto& p : pre_split(name, text)) joined += p;
    EXPECT_EQ(joined, text) << name;  // every pattern set compiles and loses nothing
  }
  EXPECT_TRUE(pre_tokenizer_spec("llama-bpe", "test").ignore_merges);
  EXPECT_FALSE(pre_tokenizer_spec("smollm", "test").ignore_merges);
}

// ---- HF tokenizer.json errors
// ----------------------------------------------------------------------

TEST(HfTokenizerJson, ShapeErrorsNameTheKey) {
  const std::string path = temp_path("tokenizer.json");
  auto write = [&](const json& j) { std::ofstream(path) << j.dump(); };
  json base = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}},
               {"pre_tokenizer", {{"type", "ByteLevel"}}},
               {"decoder", {{"type", "ByteLevel"}}}};
  json j = base;
  j["model"]["type"] = "WordPiece";
  write(j);
  expect_error([&] { load_hf_tokenizer_json(path); }, {"model.type", "WordPiece"});
  j = base;
  j["model"].erase("merges");
  write(j);
  expect_error([&] { load_hf_tokenizer_json(path); }, {"model.merges"});
  j = base;
  j["normalizer"] = {{"type", "NFKC"}};
  write(j);
  expect_error([&] { load_hf_tokenizer_json(path); }, {"normalizer.type", "NFKC"});
  j = base;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  write(j);
  expect_error([&] { load_hf_tokenizer_json(path); }, {"pre_tokenizer.type", "Whitespace"});
  // Wrong JSON types name the file and the key (they were nlohmann type_errors naming neither).
  j = base;
  j["normalizer"] = {{"type", 5}};
  write(j);
  expect_error([&] { load_hf_tokenizer_json(path); }, {path.c_str(), "normalizer.type", "must be a string"});
  j = base;
  j["decoder"] = {{"type", json::array()}};
  write(j);
  expect_error([&] { load_hf_tokenizer_json(path); }, {path.c_str(), "decoder.type", "must be a string"});
  j = base;
  j["pre_tokenizer"]["add_prefix_space"] = "yes";
  write(j);
  expect_error([&] { load_hf_tokenizer_json(path); },
               {path.c_str(), "pre_tokenizer.add_prefix_space", "must be true or false"});
  j = base;
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Split"}, {"behavior", 1}}, {{"type", "ByteLevel"}}}}};
  write(j);
  expect_error([&] { load_hf_tokenizer_json(path); },
               {path.c_str(), "pre_tokenizer.pretokenizers[0].behavior", "must be a string"});
  write(base);  // valid shape, but "a" alone is not a byte-level vocabulary
  expect_error([&] { load_hf_tokenizer_json(path); }, {"byte-level"});
  std::ofstream(path) << "{not json";
  expect_error([&] { load_hf_tokenizer_json(path); }, {"not valid JSON"});
}

}  // namespace
}  // namespace kvb::tokenizer
