// SentencePiece-style tokenizer.json (byte-fallback BPE) against HF tokenizers' ids and decodes
// (tests/fixtures/tokenizer/spm_bpe.json, written by scripts/make_spm_tokenizer_json_fixture.py
// from the committed spm_bpe/tokenizer.json and three variants of its sections), a hand-computed
// case that merges by rank differ from merges by score, the sections' error messages, and the
// padded-vocabulary decode (ids past the tokenizer decode to "").
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "workers/tokenizer/tokenizer.h"
#include "workers/tokenizer/tokenizer_impl.h"

namespace kvb::tokenizer {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kDir = std::string(KVB_FIXTURES_DIR) + "/tokenizer/";

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  return json::parse(in);
}

// A per-process folder (ctest runs tests of one binary as parallel processes).
std::string temp_file(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("kvb_spm_json_" + std::to_string(::getpid()) + "_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::create_directories(dir);
  return (dir / name).string();
}

std::string write_json(const json& j) {
  const std::string path = temp_file("tokenizer.json");
  std::ofstream(path) << j.dump();
  return path;
}

template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected kvb::Error";
  } catch (const kvb::Error& e) {
    for (const auto& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "': " << e.what();
    }
  }
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

TEST(HfSpmJson, MatchesTokenizersOnEveryVariant) {
  const json golden = read_json(kDir + "spm_bpe.json");
  const json base = read_json(kDir + "spm_bpe/tokenizer.json");
  ASSERT_EQ(golden["variants"].size(), 6u);
  for (const auto& [name, variant] : golden["variants"].items()) {
    json file = base;
    for (const char* key : {"normalizer", "pre_tokenizer", "decoder"}) file[key] = variant[key];
    const auto tok = load_hf_tokenizer_json(write_json(file));
    EXPECT_EQ(tok->vocab_size(), golden["vocab_size"].get<int>());
    EXPECT_EQ(tok->bos_id(), 1);
    EXPECT_TRUE(tok->default_add_bos());  // the TemplateProcessing "<s> $A"
    size_t checked = 0, byte_tokens = 0, streamed = 0;
    for (const auto& c : variant["cases"]) {
      const std::string text = c["text"];
      const std::vector<int32_t> want = c["ids"];
      const auto got = tok->encode(text, {.add_bos = false, .parse_special = true});
      EXPECT_EQ(ids_str(got), ids_str(want)) << name << ": " << json(text).dump();
      auto with_bos = want;
      with_bos.insert(with_bos.begin(), 1);
      EXPECT_EQ(tok->encode(text, {.add_bos = true, .parse_special = true}), with_bos) << name;
      EXPECT_EQ(tok->decode(want, false), c["decoded"].get<std::string>())
          << name << ": " << json(text).dump();
      EXPECT_EQ(tok->decode(want, true), c["decoded_skip_special"].get<std::string>())
          << name << ": " << json(text).dump();
      for (int32_t id : want) byte_tokens += id >= 3 && id <= 258;
      // Streaming (token_to_piece_after) equals decode when no special token sits mid-sequence.
      bool plain = true;
      for (int32_t id : want) plain &= !tok->is_special(id);
      if (plain) {
        std::string s;
        int32_t prev = -1;
        for (int32_t id : want) s += tok->token_to_piece_after(prev, id, true), prev = id;
        EXPECT_EQ(s, c["decoded_skip_special"].get<std::string>())
            << name << " streamed: " << json(text).dump();
        ++streamed;
      }
      ++checked;
    }
    for (const auto& c : variant["decode_cases"]) {  // invalid UTF-8 runs, specials, "▁" runs
      const std::vector<int32_t> ids = c["ids"];
      EXPECT_EQ(tok->decode(ids, false), c["decoded"].get<std::string>()) << name << " " << c;
      EXPECT_EQ(tok->decode(ids, true), c["decoded_skip_special"].get<std::string>()) << name;
      ++checked;
    }
    EXPECT_EQ(checked, 37u) << name;
    EXPECT_GT(byte_tokens, 20u) << name << ": no case needs byte fallback";
    EXPECT_GE(streamed, 20u) << name;
  }
}

// vocab a b c ab bc abc, merges "a b" (rank 0), "b c" (1), "a bc" (2): "abc" first merges a+b
// (lowest rank), then no merge joins "ab" and "c", so HF BPE gives [ab, c]. llama.cpp's SPM by
// score, with every piece scored, joins "ab" + "c" into "abc" because "abc" is in the vocabulary:
// merges by rank are not scores. (tokenizers 0.21.4 gives the ids below for this file too.)
TEST(HfSpmJson, MergesByRankNotByScore) {
  const json vocab = {{"<unk>", 0},  {"a", 1},     {"b", 2},   {"c", 3},
                      {"ab", 4},     {"bc", 5},    {"abc", 6}, {"\xE2\x96\x81", 7},
                      {"<0xC3>", 8}, {"<0xA9>", 9}};
  json file = {
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", {"a b", "b c", "a bc"}},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"fuse_unk", true}}},
      {"normalizer",
       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}},
      {"pre_tokenizer", nullptr},
      {"decoder",
       {{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}}}};
  const auto tok = load_hf_tokenizer_json(write_json(file));
  EXPECT_EQ(tok->encode("abc", {}), (std::vector<int32_t>{4, 3}));
  EXPECT_EQ(tok->encode("bc", {}), (std::vector<int32_t>{5}));
  // Only é has byte tokens: other unknown characters fall to <unk>, fused when adjacent. As in
  // HF, a pending <unk> is emitted after byte-fallback tokens that follow it, and fuses across
  // them ("xéy" -> <0xC3> <0xA9> <unk>).
  EXPECT_EQ(tok->encode("xyza", {}), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(tok->encode("x a", {}), (std::vector<int32_t>{0, 7, 1}));
  EXPECT_EQ(tok->encode("x\u00e9 a", {}), (std::vector<int32_t>{8, 9, 0, 7, 1}));
  EXPECT_EQ(tok->encode("x\u00e9y", {}), (std::vector<int32_t>{8, 9, 0}));
  file["model"]["fuse_unk"] = false;
  EXPECT_EQ(load_hf_tokenizer_json(write_json(file))->encode("xyza", {}),
            (std::vector<int32_t>{0, 0, 0, 1}));
  SpmVocab spm;
  spm.source = "test";
  for (const auto& [text, id] : vocab.items()) {
    spm.tokens.resize(std::max<size_t>(spm.tokens.size(), id.get<size_t>() + 1));
    spm.tokens[id.get<size_t>()] = text;
  }
  spm.scores.assign(spm.tokens.size(), 0.0f);
  spm.kinds.assign(spm.tokens.size(), TokenKind::kNormal);
  spm.add_space_prefix = false;
  EXPECT_EQ(make_spm_tokenizer(spm)->encode("abc", {}), (std::vector<int32_t>{6}));
}

TEST(HfSpmJson, SectionErrorsNameTheFileAndKey) {
  const json base = read_json(kDir + "spm_bpe/tokenizer.json");
  ASSERT_EQ(base["decoder"]["decoders"].size(), 4u);  // Replace, ByteFallback, Fuse, Strip
  auto expect = [&](const std::function<void(json&)>& mutate,
                    std::initializer_list<std::string> parts) {
    json j = base;
    mutate(j);
    const std::string path = write_json(j);
    std::vector<std::string> all(parts);
    all.push_back(path);
    try {
      load_hf_tokenizer_json(path);
      ADD_FAILURE() << "expected an error mentioning " << *parts.begin();
    } catch (const kvb::Error& e) {
      for (const auto& p : all) {
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
            << "message lacks '" << p << "': " << e.what();
      }
    }
  };
  const json metaspace = {{"type", "Metaspace"},
                          {"replacement", "\xE2\x96\x81"},
                          {"prepend_scheme", "first"},
                          {"split", false}};
  expect([&](json& j) { j["pre_tokenizer"] = metaspace, j["pre_tokenizer"].erase("replacement"); },
         {"pre_tokenizer.replacement", "missing"});
  expect([&](json& j) { j["pre_tokenizer"] = metaspace, j["pre_tokenizer"]["replacement"] = "ab"; },
         {"pre_tokenizer.replacement", "one character"});
  expect([&](json& j) { j["pre_tokenizer"] = metaspace, j["pre_tokenizer"]["replacement"] = 7; },
         {"pre_tokenizer.replacement", "string"});
  expect(
      [&](json& j) {
        j["pre_tokenizer"] = metaspace, j["pre_tokenizer"]["prepend_scheme"] = "sometimes";
      },
      {"pre_tokenizer.prepend_scheme", "sometimes"});
  expect([&](json& j) { j["pre_tokenizer"] = metaspace, j["pre_tokenizer"]["split"] = "yes"; },
         {"pre_tokenizer.split", "true or false"});
  expect(
      [&](json& j) {
        j["pre_tokenizer"] = {{"type", "Whitespace"}};
      },
      {"pre_tokenizer.type", "Whitespace"});
  const json split = {{"type", "Split"},
                      {"pattern", {{"String", " "}}},
                      {"behavior", "MergedWithPrevious"},
                      {"invert", false}};
  expect([&](json& j) { j["pre_tokenizer"] = split, j["pre_tokenizer"]["behavior"] = "Isolated"; },
         {"pre_tokenizer.behavior", "MergedWithPrevious"});
  expect([&](json& j) { j["pre_tokenizer"] = split, j["pre_tokenizer"]["invert"] = true; },
         {"pre_tokenizer.invert"});
  expect([&](json& j) { j["pre_tokenizer"] = split, j["pre_tokenizer"]["pattern"] = " "; },
         {"pre_tokenizer.pattern", "String"});
  expect(
      [&](json& j) {
        j["pre_tokenizer"] = {{"type", "Digits"}};
      },
      {"pre_tokenizer.type", "Digits", "Metaspace"});
  expect(
      [&](json& j) {
        j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
      },
      {"normalizer.normalizers[1].pattern", "Regex"});
  expect(
      [&](json& j) {
        j["normalizer"]["normalizers"][0] = {{"type", "NFKC"}};
      },
      {"normalizer.normalizers[0].type", "NFKC"});
  expect([&](json& j) { j["normalizer"]["normalizers"][0].erase("prepend"); },
         {"normalizer.normalizers[0].prepend", "missing"});
  expect([&](json& j) { j["normalizer"]["normalizers"] = "Prepend"; },
         {"normalizer.normalizers", "array"});
  expect([&](json& j) { j["normalizer"] = nullptr; }, {"pre_tokenizer", "neither"});
  expect([&](json& j) { j["decoder"]["decoders"][3]["start"] = -1; },
         {"decoder.decoders[3].start", "-1"});
  expect([&](json& j) { j["decoder"]["decoders"][3]["content"] = ""; },
         {"decoder.decoders[3].content", "one character"});
  expect(
      [&](json& j) {
        j["decoder"]["decoders"][2] = {{"type", "CTC"}};
      },
      {"decoder.decoders[2].type", "CTC"});
  expect([&](json& j) { j["decoder"]["decoders"][0]["content"] = nullptr; },
         {"decoder.decoders[0].content", "string"});
  expect([&](json& j) { j["decoder"]["decoders"][1] = 5; }, {"decoder.decoders[1]", "object"});
  expect([&](json& j) { j.erase("decoder"); }, {"decoder", "missing"});
  expect([&](json& j) { j["model"]["byte_fallback"] = "true"; },
         {"model.byte_fallback", "true or false"});
  expect([&](json& j) { j["added_tokens"][1]["normalized"] = true; },
         {"added_tokens[1].normalized"});
  expect([&](json& j) { j["model"]["merges"][0] = "zz qq"; }, {"merge 0", "not in the vocabulary"});
  expect(
      [&](json& j) {
        j["pre_tokenizer"] = {{"type", "ByteLevel"}}, j["normalizer"] = nullptr;
      },
      {"model.byte_fallback", "ByteLevel"});
}

// A model with more logits rows than the tokenizer has tokens: ids in between decode to "" (as
// HF tokenizers' decode skips unknown ids), ids past the model still throw.
TEST(PaddedVocab, IdsPastTheTokenizerDecodeToNothing) {
  auto inner = load_hf_tokenizer_json(kDir + "spm_bpe/tokenizer.json");
  const int32_t n = inner->vocab_size();
  const std::vector<int32_t> hello = inner->encode("Hello world", {});
  expect_error([&] { inner->decode({hello[0], n}, false); }, {"out of range"});
  EXPECT_EQ(pad_vocabulary(std::move(inner), n)->vocab_size(), n);  // equal sizes: no wrapper
  const auto tok = pad_vocabulary(load_hf_tokenizer_json(kDir + "spm_bpe/tokenizer.json"), n + 64);
  EXPECT_EQ(tok->vocab_size(), n + 64);
  std::vector<int32_t> ids = {n + 5};
  ids.insert(ids.end(), hello.begin(), hello.end());
  ids.push_back(n + 63);
  EXPECT_EQ(tok->decode(ids, false), "Hello world");
  EXPECT_EQ(tok->decode(ids, true), "Hello world");
  EXPECT_EQ(tok->token_to_piece(n), "");
  EXPECT_EQ(tok->token_to_piece_after(-1, n + 1), "");
  EXPECT_FALSE(tok->is_special(n));
  EXPECT_EQ(tok->encode("Hello world", {}), hello);
  EXPECT_EQ(tok->bos_id(), 1);
  expect_error([&] { tok->decode({n + 64}, false); }, {"out of range"});
  expect_error([&] { pad_vocabulary(load_hf_tokenizer_json(kDir + "spm_bpe/tokenizer.json"), 10); },
               {"smaller"});
}

}  // namespace
}  // namespace kvb::tokenizer
