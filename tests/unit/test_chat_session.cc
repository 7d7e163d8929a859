// How a model session uses its GGUF's chat template (workers/model_session.cc): BOS is added
// only when the template does not write the BOS token's text itself; a template that refuses the
// conversation, is not valid Jinja, or does not render the user message once gives a usage error
// that names the model file and says why, while prompts without chat still work; a model without
// a template is refused for chat. On tiny byte-level GGUF vocabularies written here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/error.h"
#include "tokenizer_gguf_writer.h"
#include "workers/model_session.h"
#include "workers/tokenizer/unicode.h"

namespace kvb {
namespace {

constexpr int32_t kBos = 256, kEos = 257;

// 256 byte tokens, then <s> and </s> (control); add_bos_token true. template "" = none.
std::string write_model(const std::string& name, const std::string& chat_template) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(tokenizer::unicode::byte_to_unicode()[b]);
  tokens.push_back("<s>");
  tokens.push_back("</s>");
  std::vector<int32_t> types(tokens.size(), 1);
  types[kBos] = types[kEos] = 3;
  testing::GgufMetadataWriter w;
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "gpt2");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", {});
  w.add_u32("tokenizer.ggml.bos_token_id", kBos);
  w.add_u32("tokenizer.ggml.eos_token_id", kEos);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  if (!chat_template.empty()) w.add_string("tokenizer.chat_template", chat_template);
  const std::string dir =
      std::string(KVB_BINARY_DIR) + "/test_chat_session_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name + ".gguf";
  EXPECT_TRUE(w.write(path));
  return path;
}

std::vector<int32_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::string usage_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(ChatSession, BosOnlyWhenTheTemplateDoesNotWriteIt) {
  const std::string writes = write_model(
      "writes_bos",
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}"
      "{% endfor %}{% if add_generation_prompt %}>{% endif %}");
  const workers::LoadedModel a = workers::load_tokenizer_only(writes, "");
  ASSERT_NE(a.chat, nullptr) << a.chat_error;
  EXPECT_TRUE(a.chat_writes_bos);
  // <s> written by the template (parsed as its control token), the user text as plain bytes
  // (so its "</s>" stays text), no second BOS.
  std::vector<int32_t> want = {kBos};
  for (int32_t b : bytes("[user]")) want.push_back(b);
  for (int32_t b : bytes("hi</s>")) want.push_back(b);
  want.push_back(kEos);
  want.push_back('>');
  EXPECT_EQ(workers::encode_prompt(a, "hi</s>", true, ""), want);
  // Without chat the model's add_bos_token holds.
  std::vector<int32_t> plain = {kBos, 'h', 'i'};
  EXPECT_EQ(workers::encode_prompt(a, "hi", false, ""), plain);

  const workers::LoadedModel b = workers::load_tokenizer_only(
      write_model("no_bos", "{% for m in messages %}<{{ m.content }}>{% endfor %}"), "");
  ASSERT_NE(b.chat, nullptr);
  EXPECT_FALSE(b.chat_writes_bos);
  EXPECT_EQ(workers::encode_prompt(b, "x", true, ""), (std::vector<int32_t>{kBos, '<', 'x', '>'}));
  // A system message goes through the template.
  EXPECT_EQ(workers::encode_prompt(b, "x", true, "S"),
            (std::vector<int32_t>{kBos, '<', 'S', '>', '<', 'x', '>'}));
}

TEST(ChatSession, TemplateErrorsNameTheModel) {
  const std::string refuses =
      write_model("refuses",
                  "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message "
                  "is required') }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}");
  const workers::LoadedModel r = workers::load_tokenizer_only(refuses, "");
  std::string e = usage_error([&] { workers::encode_prompt(r, "x", true, ""); });
  EXPECT_NE(e.find(refuses), std::string::npos) << e;
  EXPECT_NE(e.find("a system message is required"), std::string::npos) << e;
  EXPECT_EQ(workers::encode_prompt(r, "x", true, "S").size(), 3u);  // with one it renders (+BOS)

  const std::string broken = write_model("broken", "{% for m in messages %}{{ m.content }}");
  const workers::LoadedModel b = workers::load_tokenizer_only(broken, "");
  EXPECT_EQ(b.chat, nullptr);
  EXPECT_NE(b.chat_error.find(broken), std::string::npos) << b.chat_error;
  EXPECT_EQ(workers::encode_prompt(b, "x", false, "").size(), 2u);  // prompts without chat run
  e = usage_error([&] { workers::encode_prompt(b, "x", true, ""); });
  EXPECT_NE(e.find("not valid Jinja"), std::string::npos) << e;
  EXPECT_NE(e.find(broken), std::string::npos) << e;

  const std::string twice =
      write_model("twice", "{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}");
  e = usage_error(
      [&] { workers::encode_prompt(workers::load_tokenizer_only(twice, ""), "x", true, ""); });
  EXPECT_NE(e.find("exactly once"), std::string::npos) << e;
  EXPECT_NE(e.find(twice), std::string::npos) << e;

  const std::string none = write_model("none", "");
  e = usage_error(
      [&] { workers::encode_prompt(workers::load_tokenizer_only(none, ""), "x", true, ""); });
  EXPECT_NE(e.find("no chat template"), std::string::npos) << e;
  EXPECT_NE(e.find(none), std::string::npos) << e;
}

}  // namespace
}  // namespace kvb
