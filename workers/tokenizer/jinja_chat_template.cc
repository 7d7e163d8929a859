// JinjaChatTemplate: a model's chat template rendered by minja with transformers' environment
// and context (transformers 4.53 utils/chat_template_utils.py: _compile_jinja_template and
// render_jinja_template; apply_chat_template passes the tokenizer's special tokens).
#include "workers/tokenizer/jinja_chat_template.h"

#include <chrono>
#include <ctime>
#include <functional>
#include <mutex>
#include <iomanip>
#include <minja.hpp>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "workers/tokenizer/render_sandbox.h"

namespace kvb::tokenizer {

struct JinjaChatTemplate::Parsed {
  std::shared_ptr<minja::TemplateNode> root;
};

struct JinjaChatTemplate::Verdict {
  std::mutex mu;
  std::string error;  // "" until a render exceeded a limit or crashed the renderer
};

namespace {

// Deepest nesting of brackets and of block statements ({% if %} ... {% endif %}), counted on the
// raw text (string literals included, so it over-counts, never under-counts). minja's parser
// recurses once per level, so a hostile template of a million '(' would overflow the stack.
int max_nesting(const std::string& t) {
  int brackets = 0, blocks = 0, deepest = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '(' || c == '[' || c == '{') {
      deepest = std::max(deepest, ++brackets);
    } else if (c == ')' || c == ']' || c == '}') {
      brackets = std::max(0, brackets - 1);
    }
    if (c == '{' && i + 1 < t.size() && t[i + 1] == '%') {
      size_t p = i + 2;
      while (p < t.size() && (t[p] == '-' || t[p] == '+' || t[p] == ' ' || t[p] == '\t' ||
                              t[p] == '\n' || t[p] == '\r')) {
        ++p;
      }
      size_t e = p;
      while (e < t.size() && std::isalpha(static_cast<unsigned char>(t[e]))) ++e;
      const std::string kw = t.substr(p, e - p);
      if (kw == "if" || kw == "for" || kw == "macro" || kw == "call" || kw == "filter" ||
          kw == "generation") {
        deepest = std::max(deepest, ++blocks);
      } else if (kw.rfind("end", 0) == 0) {
        blocks = std::max(0, blocks - 1);
      }
    }
  }
  return deepest;
}

}  // namespace

JinjaChatTemplate::JinjaChatTemplate(std::string text, std::string bos_token, std::string eos_token,
                                     std::string origin)
    : text_(std::move(text)),
      bos_token_(std::move(bos_token)),
      eos_token_(std::move(eos_token)),
      origin_(std::move(origin)) {
  KVB_USAGE_CHECK(!text_.empty()) << origin_ << ": the chat template is empty";
  KVB_USAGE_CHECK(text_.size() <= kMaxTemplateBytes)
      << origin_ << ": the chat template has " << text_.size() << " bytes, more than the "
      << kMaxTemplateBytes << " kvbench accepts (real templates are a few KB): a damaged file?";
  const int depth = max_nesting(text_);
  KVB_USAGE_CHECK(depth <= kMaxNesting)
      << origin_ << ": the chat template nests brackets or blocks " << depth
      << " deep, more than the " << kMaxNesting << " kvbench accepts: a damaged file?";
  // transformers: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True), and
  // Jinja's default keep_trailing_newline=False.
  minja::Options options{};
  options.trim_blocks = true;
  options.lstrip_blocks = true;
  options.keep_trailing_newline = false;
  auto parsed = std::make_unique<Parsed>();
  try {
    parsed->root = minja::Parser::parse(text_, options);
  } catch (const std::exception& e) {
    KVB_USAGE_FAIL() << origin_ << ": the chat template is not valid Jinja: " << e.what();
  }
  parsed_ = std::move(parsed);
  verdict_ = std::make_shared<Verdict>();
}

JinjaChatTemplate::~JinjaChatTemplate() = default;
JinjaChatTemplate::JinjaChatTemplate(JinjaChatTemplate&&) noexcept = default;
JinjaChatTemplate& JinjaChatTemplate::operator=(JinjaChatTemplate&&) noexcept = default;

std::string JinjaChatTemplate::render(const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt) const {
  using json = nlohmann::ordered_json;
  // The render runs in a forked child under limits (render_sandbox.h): the template is code from
  // whoever made the model file, and minja can recurse without end, loop without end or allocate
  // without bound, none of which can be stopped inside this process.
  const std::function<std::string()> work = [&]() -> std::string {
    json msgs = json::array();
    for (const auto& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
    auto ctx = minja::Context::make(json({{"messages", msgs},
                                          {"add_generation_prompt", add_generation_prompt},
                                          {"tools", nullptr},
                                          {"documents", nullptr}}));
    if (!bos_token_.empty()) ctx->set("bos_token", minja::Value(bos_token_));
    if (!eos_token_.empty()) ctx->set("eos_token", minja::Value(eos_token_));
    // transformers: datetime.now().strftime(format), local time.
    ctx->set("strftime_now",
             minja::Value::callable([](const std::shared_ptr<minja::Context>&,
                                       minja::ArgumentsValue& args) -> minja::Value {
               args.expectArgs("strftime_now", {1, 1}, {0, 0});
               const std::string format = args.args[0].get<std::string>();
               const std::time_t now =
                   std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
               std::tm local{};
               localtime_r(&now, &local);
               std::ostringstream ss;
               ss << std::put_time(&local, format.c_str());
               return minja::Value(ss.str());
             }));
    return parsed_->root->render(ctx);
  };
  {
    std::lock_guard<std::mutex> lock(verdict_->mu);
    KVB_USAGE_CHECK(verdict_->error.empty()) << verdict_->error;
  }
  SandboxResult r = run_sandboxed(work, limits_);
  std::string hostile;
  switch (r.status) {
    case SandboxResult::Status::kOk:
      return std::move(r.output);
    case SandboxResult::Status::kFailed:
      KVB_USAGE_FAIL() << origin_ << ": the chat template refused the conversation ("
                       << messages.size() << " messages): " << r.message;
    case SandboxResult::Status::kLimit:
      hostile = origin_ + ": the chat template exceeded the " + r.message +
                ". A model file's template is code from whoever made the file; kvbench renders "
                "it in an isolated process under limits. Run without chat, or use a model file "
                "with a sound template";
      break;
    case SandboxResult::Status::kCrashed:
      hostile = origin_ + ": the chat template crashed kvbench's isolated renderer: " + r.message +
                ". Run without chat, or use a model file with a sound template";
      break;
    case SandboxResult::Status::kUnavailable:
      KVB_FAIL() << origin_ << ": cannot render the chat template: " << r.message;
  }
  {
    std::lock_guard<std::mutex> lock(verdict_->mu);
    if (verdict_->error.empty()) verdict_->error = hostile;
  }
  KVB_USAGE_FAIL() << hostile;
  return "";
}

std::string render_chat_template(const std::string& text, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const std::string& bos_token,
                                 const std::string& eos_token, const std::string& origin) {
  return JinjaChatTemplate(text, bos_token, eos_token, origin)
      .render(messages, add_generation_prompt);
}

}  // namespace kvb::tokenizer
