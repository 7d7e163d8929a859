// The model's own chat template, rendered by kvbench's Jinja engine (minja), against
// transformers' apply_chat_template(tokenize=False) on seven families (SmolLM2/ChatML, Gemma 2,
// Llama-3.1, Qwen2.5, Qwen3, Mistral Nemo, Phi-3.5): every render equal byte for byte, every
// refusal (raise_exception) a usage error that names the template and carries its message
// (tests/fixtures/tokenizer/chat_template_renders.json, scripts/make_chat_template_fixture.py).
// The hand-written formats (workers/tokenizer/chat_template.cc) serve as a second oracle.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
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

// A model file's template is code from a stranger. Each of these crashed (SIGSEGV) or hung kvbench
// before the render was isolated (render_sandbox.h); each is now a usage error naming the template's
// source and the limit it hit, and the process (and the next render) carry on. Small limits keep
// the cases fast; the defaults are checked on the recursion cases and in test_chat_validate.cc.
std::string render_error(const std::string& text, const SandboxLimits& limits) {
  JinjaChatTemplate t(text, "", "", "evil/tokenizer_config.json: chat_template");
  t.set_limits(limits);
  try {
    const std::string out = t.render({{"user", "x"}}, true);
    ADD_FAILURE() << "rendered " << out.size() << " bytes: " << text;
  } catch (const kvb::Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find("evil/tokenizer_config.json: chat_template"),
              std::string::npos)
        << e.what();
    return e.what();
  }
  return "";
}

SandboxLimits small_limits() {
  SandboxLimits l;
  l.seconds = 60;  // never the limit that trips below: the others are met in well under a second
  l.max_steps = 200'000;
  l.max_live_bytes = size_t{16} << 20;  // 'x' * n reaches it in ~1.5 s (90 ns an append)
  l.max_output_bytes = size_t{1} << 20;
  return l;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(JinjaChatTemplate, EndlessRecursionIsARecursionLimitNotACrash) {
  const SandboxLimits defaults;
  for (const std::string text :
       {"{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}",
        "{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n) }}{% endmacro %}{{ a(0) }}",
        "{% set xs = [1, 2] %}{% for x in xs recursive %}{{ loop(xs) }}{% endfor %}",
        "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}"}) {
    SCOPED_TRACE(text);
    const std::string e = render_error(text, defaults);
    EXPECT_TRUE(has(e, "exceeded the recursion depth limit: the render went deeper than 2048 KiB "
                       "of stack"))
        << e;
  }
  // A bounded recursion as deep as real templates go renders.
  JinjaChatTemplate ok(
      "{% macro f(n) %}{% if n < 100 %}{{ f(n + 1) }}{% else %}{{ n }}{% endif %}{% endmacro %}"
      "{{ f(0) }}",
      "", "", "t");
  EXPECT_EQ(ok.render({{"user", "x"}}, true), "100");
}

TEST(JinjaChatTemplate, LoopAndAllocationBombsHitTheirLimits) {
  const SandboxLimits l = small_limits();
  // Steps: 10^10 iterations that allocate a little each (memory to spare for the ranges).
  SandboxLimits roomy = l;
  roomy.max_live_bytes = size_t{256} << 20;
  EXPECT_TRUE(has(render_error("{% for i in range(100000) %}{% for j in range(100000) %}x"
                               "{% endfor %}{% endfor %}",
                               roomy),
                  "exceeded the evaluation step limit: the render made more than 200000 steps"));
  // Memory: a 3 GB string, a billion-element list, a doubling list, a string doubled by a loop.
  for (const std::string text :
       {"{{ 'x' * 3000000000 }}", "{{ range(1000000000) }}",
        "{% for i in range(1000000000) %}{% endfor %}",
        "{% set ns = namespace(l=[0]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
        "{% endfor %}{{ ns.l | length }}",
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}{{ ns.s | length }}"}) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(has(render_error(text, l),
                    "exceeded the memory limit: the render built more than 16 MiB of values"));
  }
  // A dict bomb ("billion laughs"): 64 levels of a dict holding the previous level twice cost
  // nothing until tojson writes 2^64 leaves.
  const std::string dict = render_error(
      "{% set ns = namespace(d={}) %}{% for i in range(64) %}"
      "{% set ns.d = {'a': ns.d, 'b': ns.d} %}{% endfor %}{{ ns.d | tojson }}",
      l);
  EXPECT_TRUE(has(dict, "exceeded the evaluation step limit")) << dict;
  SandboxLimits big = l;
  big.max_live_bytes = size_t{1} << 30;
  big.max_steps = 10'000'000;
  // Output: 2 MB of text against a 1 MiB limit (steps and memory to spare).
  const std::string out =
      render_error("{% for i in range(20000) %}" + std::string(100, 'y') + "{% endfor %}", big);
  EXPECT_TRUE(has(out, "exceeded the output size limit: the render wrote 2000000 bytes, more than "
                       "1 MiB"))
      << out;
}

TEST(JinjaChatTemplate, ALoopThatNeverAllocatesIsStoppedByTheTimeLimit) {
  // minja multiplies a string by appending it n times: with '' nothing grows, nothing allocates,
  // and 10^12 appends take hours. Only a process that can be killed stops it.
  SandboxLimits l = small_limits();
  l.seconds = 1;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = render_error("{{ '' * 1000000000000 }}", l);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(has(e, "exceeded the time limit: the render took longer than 1 s")) << e;
  EXPECT_LT(took, 30.0);  // killed at 1 s; generous for a loaded machine
}

TEST(JinjaChatTemplate, ACrashOfTheRendererIsAnErrorNotOurs) {
  // A recursion limit above the render thread's stack: the child overflows its stack and dies by
  // SIGSEGV, as minja did inside kvbench before; the caller gets an error and carries on.
  SandboxLimits l = small_limits();
  l.max_stack_bytes = size_t{64} << 20;
  l.thread_stack_bytes = size_t{1} << 20;
  l.max_steps = 100'000'000;
  const std::string e = render_error("{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}", l);
  EXPECT_TRUE(has(e, "crashed kvbench's isolated renderer: the renderer died with signal 11 "
                     "(SIGSEGV"))
      << e;
  // minja divides integers by zero: SIGFPE, which would have killed kvbench (found by a random
  // corpus of hostile templates through kvbench generate --chat).
  for (const std::string text : {"{{ 1 // 0 }}", "{{ 1 % 0 }}"}) {
    EXPECT_TRUE(has(render_error(text, small_limits()),
                    "crashed kvbench's isolated renderer: the renderer died with signal 8 "
                    "(SIGFPE"))
        << text;
  }
  // The same process renders the next template.
  JinjaChatTemplate ok("{{ messages[0]['content'] }}!", "", "", "t");
  EXPECT_EQ(ok.render({{"user", "after"}}, true), "after!");
}

TEST(JinjaChatTemplate, AHostileTemplateFailsAgainAtOnce) {
  // The time limit is paid once per template object: its later renders (a worker renders a
  // model's template once per chat prompt) fail with the same error without a second wait.
  JinjaChatTemplate t("{{ '' * 1000000000000 }}", "", "", "slow.gguf: tokenizer.chat_template");
  SandboxLimits l;
  l.seconds = 1;
  t.set_limits(l);
  std::string first;
  try {
    t.render({{"user", "x"}}, true);
  } catch (const kvb::Error& e) {
    first = e.what();
  }
  EXPECT_TRUE(has(first, "slow.gguf: tokenizer.chat_template: the chat template exceeded the time "
                         "limit"))
      << first;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) {
    try {
      t.render({{"user", "y"}}, false);
      ADD_FAILURE() << "rendered";
    } catch (const kvb::Error& e) {
      EXPECT_EQ(e.what(), first);
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    }
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  // A template that only refuses a conversation is not hostile: the next conversation renders.
  JinjaChatTemplate picky(
      "{% if messages | length > 1 %}{{ raise_exception('one turn only') }}{% endif %}ok", "", "",
      "t");
  EXPECT_THROW(picky.render({{"user", "a"}, {"user", "b"}}, true), kvb::Error);
  EXPECT_EQ(picky.render({{"user", "a"}}, true), "ok");
}

TEST(JinjaChatTemplate, SandboxReportsWhatTheWorkThrowsAndReturns) {
  SandboxLimits l;
  SandboxResult r = run_sandboxed([] { return std::string(100000, 'z'); }, l);
  EXPECT_EQ(r.status, SandboxResult::Status::kOk);
  EXPECT_EQ(r.output, std::string(100000, 'z'));
  r = run_sandboxed([]() -> std::string { throw std::runtime_error("bad input at line 3"); }, l);
  EXPECT_EQ(r.status, SandboxResult::Status::kFailed);
  EXPECT_EQ(r.message, "bad input at line 3");
  r = run_sandboxed([]() -> std::string { std::abort(); }, l);
  EXPECT_EQ(r.status, SandboxResult::Status::kCrashed);
  EXPECT_TRUE(has(r.message, "(SIGABRT")) << r.message;
}

}  // namespace
}  // namespace kvb::tokenizer
