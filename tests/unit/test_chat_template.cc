// Chat templates: exact renders for ChatML (SmolLM2), Llama-3 and Gemma written out by hand from
// their Jinja templates, the same renders produced by transformers / jinja2
// (tests/fixtures/tokenizer/{smollm2_gguf,chat_templates}.json), and detection by signature.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "workers/tokenizer/tokenizer.h"

namespace kvb::tokenizer {
namespace {

using json = nlohmann::json;

json fixture(const std::string& name) {
  std::ifstream in(std::string(KVB_FIXTURES_DIR) + "/tokenizer/" + name);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  return json::parse(in);
}

std::vector<ChatMessage> messages_of(const json& list) {
  std::vector<ChatMessage> out;
  for (const auto& m : list) out.push_back({m["role"], m["content"]});
  return out;
}

const char kSmolSystem[] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json chat_template.
const char kLlama3Template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
    "<|end_header_id|>\n\n' }}{% endif %}";
// google/gemma-2-2b-it chat_template.
const char kGemmaTemplate[] =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
    "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

TEST(ChatTemplate, DetectsFormatsFromRealTemplates) {
  const std::string smol = fixture("smollm2_gguf.json")["chat_template"];
  EXPECT_EQ(detect_chat_format(smol), ChatFormat::kChatML);
  EXPECT_EQ(detect_chat_format(kLlama3Template), ChatFormat::kLlama3);
  EXPECT_EQ(detect_chat_format(kGemmaTemplate), ChatFormat::kGemma);
  const json jt = fixture("chat_templates.json");
  EXPECT_EQ(detect_chat_format(jt["llama3_template"]), ChatFormat::kLlama3);
  EXPECT_EQ(detect_chat_format(jt["gemma_template"]), ChatFormat::kGemma);
  EXPECT_EQ(detect_chat_format(""), ChatFormat::kNone);
  EXPECT_EQ(detect_chat_format("{{ messages[0]['content'] }}"), ChatFormat::kNone);
  EXPECT_STREQ(chat_format_name(ChatFormat::kChatML), "chatml");
  EXPECT_STREQ(chat_format_name(ChatFormat::kNone), "none");
}

TEST(ChatTemplate, DefaultSystemMessageFromTemplate) {
  EXPECT_EQ(chat_default_system(fixture("smollm2_gguf.json")["chat_template"]), kSmolSystem);
  EXPECT_EQ(chat_default_system(kLlama3Template), "");
  // A literal concatenated with the user's system content is not a default.
  EXPECT_EQ(chat_default_system("{{ '<|im_start|>system\\n' + messages[0]['content'] + "
                                "'<|im_end|>\\n' }}"),
            "");
  // Escaped form (\n written as backslash-n, an escaped quote inside).
  EXPECT_EQ(chat_default_system("{{ '<|im_start|>system\\nYou\\'re Qwen.<|im_end|>\\n' }}"),
            "You're Qwen.");
}

TEST(ChatTemplate, ChatMLExact) {
  EXPECT_EQ(apply_chat_template(ChatFormat::kChatML, {{"user", "What is the capital of France?"}}),
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template(ChatFormat::kChatML, {{"user", "Hi"}}, true, kSmolSystem),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // A system message replaces the default; content is not trimmed.
  EXPECT_EQ(apply_chat_template(ChatFormat::kChatML,
                                {{"system", "Be brief."}, {"user", " x "}, {"assistant", "y"}},
                                false, kSmolSystem),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n x <|im_end|>\n"
            "<|im_start|>assistant\ny<|im_end|>\n");
  EXPECT_EQ(apply_chat_template(ChatFormat::kChatML, {}, true, kSmolSystem),
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, SmolLM2MatchesTransformers) {
  const json f = fixture("smollm2_gguf.json");
  const std::string def = chat_default_system(f["chat_template"]);
  ASSERT_GE(f["chat_renders"].size(), 3u);
  for (const auto& r : f["chat_renders"]) {
    EXPECT_EQ(apply_chat_template(ChatFormat::kChatML, messages_of(r["messages"]),
                                  r["add_generation_prompt"], def),
              r["text"].get<std::string>());
  }
  EXPECT_EQ(f["chat_renders"][0]["text"].get<std::string>(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3Exact) {
  EXPECT_EQ(
      apply_chat_template(ChatFormat::kLlama3,
                          {{"system", "Be brief."}, {"user", "  Hi!\n"}, {"assistant", "Hey"}}),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHey<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(apply_chat_template(ChatFormat::kLlama3, {{"user", "Q"}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>");
  for (const auto& r : fixture("chat_templates.json")["llama3"]) {
    EXPECT_EQ(apply_chat_template(ChatFormat::kLlama3, messages_of(r["messages"])),
              r["text"].get<std::string>());
  }
}

TEST(ChatTemplate, GemmaExact) {
  EXPECT_EQ(apply_chat_template(ChatFormat::kGemma, {{"user", "Hello "}}),
            "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(
      apply_chat_template(ChatFormat::kGemma,
                          {{"system", "Sys"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}}),
      "<bos><start_of_turn>user\nSys\n\nU1<end_of_turn>\n<start_of_turn>model\nA1"
      "<end_of_turn>\n<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(apply_chat_template(ChatFormat::kGemma, {{"user", "U"}}, false, "Def"),
            "<bos><start_of_turn>user\nDef\n\nU<end_of_turn>\n");
  for (const auto& r : fixture("chat_templates.json")["gemma"]) {
    EXPECT_EQ(apply_chat_template(ChatFormat::kGemma, messages_of(r["messages"])),
              r["text"].get<std::string>());
  }
}

TEST(ChatTemplate, Errors) {
  EXPECT_THROW(apply_chat_template(ChatFormat::kNone, {{"user", "x"}}), kvb::Error);
  EXPECT_THROW(apply_chat_template(ChatFormat::kGemma, {{"assistant", "x"}}), kvb::Error);
  EXPECT_THROW(apply_chat_template(ChatFormat::kGemma, {{"user", "a"}, {"user", "b"}}), kvb::Error);
  EXPECT_THROW(apply_chat_template(ChatFormat::kChatML, {{"narrator", "x"}}), kvb::Error);
}

}  // namespace
}  // namespace kvb::tokenizer
