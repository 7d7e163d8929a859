// The model's own chat template, rendered by kvbench's Jinja engine (minja), against
// transformers' apply_chat_template(tokenize=False) on seven families (SmolLM2/ChatML, Gemma 2,
// Llama-3.1, Qwen2.5, Qwen3, Mistral Nemo, Phi-3.5): every render equal byte for byte, every
// refusal (raise_exception) a usage error that names the template and carries its message
// (tests/fixtures/tokenizer/chat_template_renders.json, scripts/make_chat_template_fixture.py).
// The hand-written formats (workers/tokenizer/chat_template.cc) serve as a second oracle.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "workers/tokenizer/jinja_chat_template.h"

namespace kvb::tokenizer {
namespace {

using json = nlohmann::json;

const json& renders() {
  static const json doc = [] {
    std::ifstream in(std::string(KVB_FIXTURES_DIR) + "/tokenizer/chat_template_renders.json");
    EXPECT_TRUE(in.good()) << "missing fixture chat_template_renders.json";
    return json::parse(in);
  }();
  return doc;
}

const json& family(const std::string& name) {
  for (const auto& f : renders()["families"]) {
    if (f["name"] == name) return f;
  }
  ADD_FAILURE() << "no family " << name;
  static const json none;
  return none;
}

std::vector<ChatMessage> messages_of(const json& list) {
  std::vector<ChatMessage> out;
  for (const auto& m : list) out.push_back({m["role"], m["content"]});
  return out;
}

JinjaChatTemplate template_of(const json& f) {
  auto str = [](const json& v) { return v.is_null() ? std::string() : v.get<std::string>(); };
  return JinjaChatTemplate(f["template"], str(f["bos_token"]), str(f["eos_token"]),
                           "fixture " + f["name"].get<std::string>());
}

TEST(JinjaChatTemplate, FixtureCoversSixFamiliesWithRendersAndRefusals) {
  const json& fams = renders()["families"];
  ASSERT_GE(fams.size(), 6u);
  int refusals = 0;
  for (const auto& f : fams) {
    int rendered = 0;
    for (const auto& c : f["cases"]) rendered += c.contains("expected");
    EXPECT_GE(rendered, 4) << f["name"];
    refusals += static_cast<int>(f["cases"].size()) - rendered;
  }
  EXPECT_GE(refusals, 5);
}

class Family : public ::testing::TestWithParam<std::string> {};

TEST_P(Family, RendersEqualTransformers) {
  const json& f = family(GetParam());
  const JinjaChatTemplate t = template_of(f);
  for (const auto& c : f["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto messages = messages_of(c["messages"]);
    const bool gen = c["add_generation_prompt"];
    if (c.contains("expected")) {
      EXPECT_EQ(t.render(messages, gen), c["expected"].get<std::string>());
    } else {
      try {
        t.render(messages, gen);
        ADD_FAILURE() << "rendered where transformers raised: " << c["error"];
      } catch (const kvb::Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kUsage);
        const std::string what = e.what();
        EXPECT_NE(what.find(c["error"].get<std::string>()), std::string::npos) << what;
        EXPECT_NE(what.find("fixture " + GetParam()), std::string::npos) << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ChatTemplates, Family,
                         ::testing::Values("smollm2", "gemma2", "llama3.1", "qwen2.5", "qwen3",
                                           "mistral-nemo", "phi3.5"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// The hand-written formats, now oracles only, agree with the real template where they apply.
TEST(JinjaChatTemplate, AgreesWithHandWrittenOracles) {
  const JinjaChatTemplate smol = template_of(family("smollm2"));
  const JinjaChatTemplate gemma = template_of(family("gemma2"));
  const std::vector<std::vector<ChatMessage>> convs = {
      {{"user", "Hi"}},
      {{"user", " a "}, {"assistant", "b\n"}, {"user", "c"}},
  };
  for (const auto& m : convs) {
    for (bool gen : {true, false}) {
      EXPECT_EQ(smol.render(m, gen),
                apply_chat_template(ChatFormat::kChatML, m, gen, chat_default_system(smol.text())));
      EXPECT_EQ(gemma.render(m, gen), apply_chat_template(ChatFormat::kGemma, m, gen));
    }
  }
}

TEST(JinjaChatTemplate, BosAndEosReachTheTemplate) {
  const JinjaChatTemplate t(
      "[{{ bos_token }}|{{ eos_token }}|{{ tools is none }}|"
      "{{ documents is none }}|{{ messages | length }}]",
      "<B>", "<E>", "test");
  EXPECT_EQ(t.render({{"user", "x"}, {"assistant", "y"}}, true), "[<B>|<E>|True|True|2]");
  // An empty token leaves the name undefined, which renders as "".
  EXPECT_EQ(
      JinjaChatTemplate("{{ bos_token }}{% if eos_token is defined %}E{% endif %}x", "", "", "test")
          .render({}, false),
      "x");
}

// transformers' environment: trim_blocks (the newline after a block tag goes), lstrip_blocks
// (the indentation before it goes), no trailing newline kept. Expected: transformers 4.53.3
// _compile_jinja_template(t).render(messages=...). (Not checked: `tools is defined`, which is
// True in transformers, where tools=None is passed, and False in minja, whose `defined` test is
// false for none: workers/tokenizer/README.md.)
TEST(JinjaChatTemplate, WhitespaceControlAsTransformers) {
  const JinjaChatTemplate t(
      "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n"
      "{% endfor %}\n{{ messages | length }}\n",
      "", "", "test");
  EXPECT_EQ(t.render({{"user", "a"}, {"assistant", "b"}}, false), "[a]\n2");
}

TEST(JinjaChatTemplate, HostileTemplatesAreUsageErrorsNamingTheOrigin) {
  auto fails_with = [](const std::string& text, const std::string& what) {
    try {
      JinjaChatTemplate t(text, "", "", "m.gguf: tokenizer.chat_template");
      t.render({{"user", "x"}}, true);
      ADD_FAILURE() << "accepted: " << text.substr(0, 60);
    } catch (const kvb::Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      EXPECT_NE(std::string(e.what()).find("m.gguf: tokenizer.chat_template"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  fails_with("", "empty");
  fails_with("{% if x %}unclosed", "not valid Jinja");
  fails_with("{{ messages[0]['content'] ", "not valid Jinja");
  fails_with(std::string(100000, '(') + "1" + std::string(100000, ')'), "nests");
  fails_with(std::string(JinjaChatTemplate::kMaxTemplateBytes + 1, 'a'), "bytes");
  fails_with("{{ raise_exception('no tools here') }}", "no tools here");
  fails_with("{{ messages[5]['content'] }}", "refused the conversation");
}

}  // namespace
}  // namespace kvb::tokenizer
