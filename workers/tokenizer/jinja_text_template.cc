// Jinja text templates over JSON objects (jinja_text_template.h).
#include "workers/tokenizer/jinja_text_template.h"

#include <minja.hpp>
#include <nlohmann/json.hpp>

#include <regex>
#include <set>
#include <stdexcept>

#include "common/error.h"
#include "tasks/task.h"

namespace kvb::tokenizer {

namespace {

// The item's context: its fields, over minja's builtins. A name found nowhere is jinja2's
// StrictUndefined: an error, unless the template defaults it somewhere (`lenient`).
class StrictItemContext : public minja::Context {
 public:
  StrictItemContext(minja::Value&& values, std::set<std::string> lenient)
      : minja::Context(std::move(values), minja::Context::builtins()), lenient_(std::move(lenient)) {}
  bool contains(const minja::Value& key) override {
    if (minja::Context::contains(key)) return true;
    const std::string name = key.is_string() ? key.get<std::string>() : key.dump();
    if (lenient_.count(name)) return false;
    throw std::runtime_error("'" + name + "' is undefined: the item has no field of that name" +
                             " (give it one, or write {{ " + name + " | default('') }})");
  }

 private:
  std::set<std::string> lenient_;
};

// Names the template itself allows to be missing: `name | default(...)`, `name is [not] defined`.
std::set<std::string> lenient_names(const std::string& text) {
  std::set<std::string> out;
  static const std::regex re(
      R"(([A-Za-z_][A-Za-z0-9_]*)\s*(?:\|\s*(?:default|d)\s*\(|\s+is\s+(?:not\s+)?defined\b))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    out.insert((*it)[1].str());
  }
  return out;
}

constexpr size_t kItemsPerChild = 256;
constexpr size_t kOutputPerChild = size_t{32} << 20;

}  // namespace

std::vector<std::string> render_jinja_items(const std::string& text, const std::string& origin,
                                            const std::vector<std::string>& items_json,
                                            const SandboxLimits& limits) {
  minja::Options options{};
  options.trim_blocks = false;
  options.lstrip_blocks = false;
  options.keep_trailing_newline = true;
  std::shared_ptr<minja::TemplateNode> root;
  try {
    root = minja::Parser::parse(text, options);
  } catch (const std::exception& e) {
    KVB_USAGE_FAIL() << origin << ": the template is not valid Jinja: " << e.what();
  }
  const std::set<std::string> lenient = lenient_names(text);
  std::vector<std::string> out;
  out.reserve(items_json.size());
  size_t start = 0;
  while (start < items_json.size()) {
    // The child renders items from `start` until it has rendered kItemsPerChild of them or
    // kOutputPerChild bytes; it answers "<count>\n" then each text as "<bytes>:<text>", or throws
    // "<index>\n<message>" for the first item that fails.
    const std::function<std::string()> work = [&]() -> std::string {
      std::string answer;
      size_t count = 0;
      for (size_t i = start; i < items_json.size() && count < kItemsPerChild &&
                             answer.size() < kOutputPerChild;
           ++i, ++count) {
        std::string rendered;
        try {
          auto ctx = std::make_shared<StrictItemContext>(
              minja::Value(nlohmann::ordered_json::parse(items_json[i])), lenient);
          rendered = root->render(ctx);
        } catch (const std::exception& e) {
          throw std::runtime_error(std::to_string(i) + "\n" + e.what());
        }
        answer += std::to_string(rendered.size()) + ":" + rendered;
      }
      return std::to_string(count) + "\n" + answer;
    };
    SandboxResult r = run_sandboxed(work, limits);
    switch (r.status) {
      case SandboxResult::Status::kOk:
        break;
      case SandboxResult::Status::kFailed: {
        const size_t nl = r.message.find('\n');
        size_t index = start;
        try {
          index = std::stoul(r.message.substr(0, nl));
        } catch (const std::exception&) {
        }
        throw tasks::TemplateRenderError(
            origin + ": " + (nl == std::string::npos ? r.message : r.message.substr(nl + 1)),
            index);
      }
      case SandboxResult::Status::kLimit:
        KVB_USAGE_FAIL() << origin << ": the template exceeded the " << r.message
                         << " while rendering items " << start << " on; kvbench renders task "
                            "templates in an isolated process under limits";
      case SandboxResult::Status::kCrashed:
        KVB_USAGE_FAIL() << origin << ": the template crashed kvbench's isolated renderer: "
                         << r.message;
      case SandboxResult::Status::kUnavailable:
        KVB_FAIL() << origin << ": cannot render the template: " << r.message;
    }
    const std::string& a = r.output;
    const size_t nl = a.find('\n');
    KVB_CHECK(nl != std::string::npos) << origin << ": the renderer's answer has no count";
    const size_t count = std::stoul(a.substr(0, nl));
    KVB_CHECK(count > 0) << origin << ": the renderer rendered no item";
    size_t pos = nl + 1;
    for (size_t k = 0; k < count; ++k) {
      const size_t colon = a.find(':', pos);
      KVB_CHECK(colon != std::string::npos) << origin << ": a malformed render answer";
      const size_t len = std::stoul(a.substr(pos, colon - pos));
      KVB_CHECK(colon + 1 + len <= a.size()) << origin << ": a truncated render answer";
      out.push_back(a.substr(colon + 1, len));
      pos = colon + 1 + len;
    }
    start += count;
  }
  return out;
}

}  // namespace kvb::tokenizer
