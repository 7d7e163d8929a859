// Tasks defined as data (tasks/data_task.h): prompt templates, the metric table, and the task
// that reads a jsonl file and fills the templates item by item.
#include "tasks/data_task.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <filesystem>
#include <optional>
#include <pthread.h>

#include <exception>
#include <regex>

#include "common/error.h"
#include "tasks/jsonl.h"
#include "tasks/metrics.h"

namespace kvb::tasks {

namespace {

bool template_name(const std::string& n) {
  return !n.empty() && std::all_of(n.begin(), n.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
  });
}

std::string trim_blanks(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// The body of `{{ body }}` as a simple field: its name and whether it is optional (`name |
// default('')`); nullopt when it is something else.
std::optional<std::pair<std::string, bool>> simple_field(const std::string& inner) {
  const std::string body = trim_blanks(inner);
  const size_t bar = body.find('|');
  if (bar == std::string::npos) {
    if (template_name(body)) return std::make_pair(body, false);
    return std::nullopt;
  }
  const std::string name = trim_blanks(body.substr(0, bar));
  std::string filter = body.substr(bar + 1);
  filter.erase(std::remove_if(filter.begin(), filter.end(),
                              [](char ch) { return ch == ' ' || ch == '\t'; }),
               filter.end());
  if (template_name(name) && (filter == "default('')" || filter == "default(\"\")")) {
    return std::make_pair(name, true);
  }
  return std::nullopt;
}

// Whether `{{ inner }}` is a Jinja expression (it begins with a name) rather than literal braces.
bool jinja_expression(const std::string& inner) {
  const std::string body = trim_blanks(inner);
  return !body.empty() && (std::isalpha(static_cast<unsigned char>(body[0])) || body[0] == '_');
}

// A template is Jinja when it has a statement or comment, or an expression other than a bare
// field: then all of it is Jinja, rendered by minja (TaskContext::render_jinja).
bool is_jinja_template(const std::string& text) {
  if (text.find("{%") != std::string::npos || text.find("{#") != std::string::npos) return true;
  for (size_t i = text.find("{{"); i != std::string::npos; i = text.find("{{", i + 2)) {
    const size_t close = text.find("}}", i + 2);
    if (close == std::string::npos) return false;
    const std::string inner = text.substr(i + 2, close - i - 2);
    if (inner.find('{') != std::string::npos) continue;  // literal braces around a {field}
    if (!simple_field(inner) && jinja_expression(inner)) return true;
  }
  return false;
}

// In a Jinja template, `{name}` is literal text: refused, since it is kvbench's other form of a
// field and would silently print its own name.
void refuse_single_brace_fields(const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '{') continue;
    if (i + 1 < text.size() && (text[i + 1] == '{' || text[i + 1] == '%' || text[i + 1] == '#')) {
      const char end = text[i + 1] == '{' ? '}' : text[i + 1];
      const size_t close = text.find(std::string(1, end) + "}", i + 2);
      if (close == std::string::npos) return;  // minja reports it
      i = close + 1;
      continue;
    }
    const size_t close = text.find('}', i);
    if (close == std::string::npos) return;
    std::string name = text.substr(i + 1, close - i - 1);
    if (!name.empty() && name.back() == '?') name.pop_back();
    KVB_USAGE_CHECK(!template_name(name))
        << "'{" << text.substr(i + 1, close - i - 1) << "}' at character " << i + 1
        << " is literal text in a Jinja template (this one uses Jinja beyond {{ field }}): write "
           "the field as {{ " << name << " }}";
  }
}

}  // namespace

PromptTemplate parse_prompt_template(const std::string& text) {
  PromptTemplate t;
  if (is_jinja_template(text)) {
    refuse_single_brace_fields(text);
    t.jinja = text;
    return t;
  }
  std::string lit;
  auto flush = [&] {
    if (!lit.empty()) t.pieces.push_back({lit, false, false});
    lit.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '}') {
      KVB_USAGE_CHECK(i + 1 < text.size() && text[i + 1] == '}')
          << "a single '}' at character " << i + 1 << "; write '}}' for a literal brace";
      lit += '}';
      ++i;
      continue;
    }
    if (c != '{') {
      lit += c;
      continue;
    }
    if (i + 1 < text.size() && text[i + 1] == '{') {
      // Jinja's `{{ field }}` (lm-eval's doc_to_text habit) inserts the field, as `{field}` does;
      // `{{ field | default('') }}` an optional one. Any other `{{` is a literal brace (Python's
      // escape); Jinja expressions made the whole template Jinja (above).
      const size_t close = text.find("}}", i + 2);
      if (close != std::string::npos) {
        if (const auto f = simple_field(text.substr(i + 2, close - i - 2))) {
          flush();
          t.pieces.push_back({f->first, true, f->second});
          i = close + 1;
          continue;
        }
      }
      lit += '{';
      ++i;
      continue;
    }
    const size_t close = text.find('}', i);
    KVB_USAGE_CHECK(close != std::string::npos)
        << "a '{' at character " << i + 1 << " is never closed; write '{{' for a literal brace";
    std::string name = text.substr(i + 1, close - i - 1);
    const bool optional = !name.empty() && name.back() == '?';
    if (optional) name.pop_back();
    KVB_USAGE_CHECK(template_name(name))
        << "'{" << text.substr(i + 1, close - i - 1) << "}' at character " << i + 1
        << " is not a field name (letters, digits, _ and -; '{name?}' for an optional field; "
           "'{{' for a literal brace)";
    flush();
    t.pieces.push_back({name, true, optional});
    i = close;
  }
  flush();
  return t;
}

// ---- answer extraction ----------------------------------------------------------------------

namespace {
bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
std::string strip(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && space(s[b])) ++b;
  while (e > b && space(s[e - 1])) --e;
  return s.substr(b, e - b);
}
}  // namespace

void check_filter_pattern(const std::string& pattern) {
  try {
    std::regex re(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    KVB_USAGE_FAIL() << "regex_pattern '" << pattern << "' is not a valid regular expression "
                     << "(ECMAScript syntax, as C++'s std::regex reads it: " << e.what() << ")";
  }
}

namespace {
// std::regex (libstdc++) matches by recursion, about 200-300 bytes of stack per character of
// input: 100,000 characters overflow a main thread's 8 MiB (measured: `(.+)` and `([a-z ]+)+ is`
// crash there, pass with 32 MiB). So a regex step runs on its own thread with a 64 MiB stack and
// reads at most kMaxFilteredBytes (64 KiB, about 16K generated tokens; 20 MiB of stack at the
// measured rate), and a longer prediction is an error that names the limit, not a crash.
constexpr size_t kMaxFilteredBytes = size_t{64} << 10;
constexpr size_t kRegexStackBytes = size_t{64} << 20;

std::string regex_step(const FilterStep& f, const std::string& s) {
  const std::regex re(f.pattern, std::regex::ECMAScript);
  std::vector<std::string> found;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    if (m.size() == 1) {
      found.push_back(m.str(0));
      continue;
    }
    std::string first;  // lm-eval: the first non-empty group of a multi-group match
    bool any = false;
    for (size_t g = 1; g < m.size() && !any; ++g) {
      if (m[g].matched && m[g].length() > 0) {
        first = m.str(g);
        any = true;
      }
    }
    found.push_back(any ? first : (m.size() == 2 ? std::string() : f.fallback));
  }
  const long n = static_cast<long>(found.size());
  const long i = f.group_select < 0 ? n + f.group_select : f.group_select;
  return n > 0 && i >= 0 && i < n ? strip(found[static_cast<size_t>(i)]) : f.fallback;
}

struct RegexJob {
  const FilterStep* step;
  const std::string* text;
  std::string out;
  std::exception_ptr error;
};

void* run_regex_job(void* arg) {
  auto* job = static_cast<RegexJob*>(arg);
  try {
    job->out = regex_step(*job->step, *job->text);
  } catch (...) {
    job->error = std::current_exception();
  }
  return nullptr;
}

std::string regex_on_big_stack(const FilterStep& f, const std::string& s) {
  KVB_CHECK(s.size() <= kMaxFilteredBytes)
      << "the regex filter '" << f.pattern << "' reads at most " << kMaxFilteredBytes
      << " bytes of a prediction, and this one has " << s.size()
      << " (lower the task's max_new_tokens, or take the answer with a filter that reads less)";
  RegexJob job{&f, &s, {}, nullptr};
  pthread_attr_t attr;
  pthread_t thread;
  bool started = false;
  if (::pthread_attr_init(&attr) == 0) {
    started = ::pthread_attr_setstacksize(&attr, kRegexStackBytes) == 0 &&
              ::pthread_create(&thread, &attr, run_regex_job, &job) == 0;
    ::pthread_attr_destroy(&attr);
  }
  KVB_CHECK(started) << "cannot start a thread for the regex filter '" << f.pattern << "'";
  ::pthread_join(thread, nullptr);
  if (job.error) std::rethrow_exception(job.error);
  return job.out;
}
}  // namespace

std::string apply_filters(const std::vector<FilterStep>& steps, const std::string& text) {
  std::string s = text;
  for (const FilterStep& f : steps) {
    switch (f.kind) {
      case FilterStep::Kind::kRegex:
        s = regex_on_big_stack(f, s);
        break;
      case FilterStep::Kind::kTakeFirst:
        break;
      case FilterStep::Kind::kLowercase:
        for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        break;
      case FilterStep::Kind::kUppercase:
        for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        break;
      case FilterStep::Kind::kStrip:
        s = strip(s);
        break;
      case FilterStep::Kind::kRemoveWhitespace: {
        size_t b = 0;
        while (b < s.size() && space(s[b])) ++b;
        s = s.substr(b);
        break;
      }
    }
  }
  return s;
}

// ---- metrics ------------------------------------------------------------------------------------
namespace {
using Classes = std::vector<std::string>;
double exact_match(const std::string& p, const std::string& r) {
  return metrics::normalize_answer(p) == metrics::normalize_answer(r) ? 1.0 : 0.0;
}
}  // namespace

const std::vector<MetricEntry>& metric_table() {
  // clang-format off
  static const std::vector<MetricEntry> table = {
      {"string_match_all", "RULER: fraction of the references found in the prediction "
       "(case-insensitive substring)", true, false, nullptr, metrics::string_match_all},
      {"string_match_part", "RULER QA: 1 if any reference is found (case-insensitive substring)",
       true, false, nullptr, metrics::string_match_part},
      {"qa_f1", "LongBench token F1 after normalize_answer, max over references", false, false,
       [](const std::string& p, const std::string& r, const Classes&) { return metrics::qa_f1(p, r); }},
      {"qa_f1_zh", "LongBench Chinese F1 with character tokens, max over references", false, false,
       [](const std::string& p, const std::string& r, const Classes&) { return metrics::qa_f1_zh(p, r); }},
      {"exact_match", "1 if normalize_answer(prediction) equals normalize_answer(reference) "
       "(SQuAD-style), max over references", false, false,
       [](const std::string& p, const std::string& r, const Classes&) { return exact_match(p, r); }},
      {"rouge_l", "LongBench ROUGE-L F (the `rouge` package), max over references", false, false,
       [](const std::string& p, const std::string& r, const Classes&) {
         return metrics::rouge_l_longbench(p, r); }},
      {"rouge_l_zh", "LongBench ROUGE-L F on characters, max over references", false, false,
       [](const std::string& p, const std::string& r, const Classes&) { return metrics::rouge_l_zh(p, r); }},
      {"classification", "LongBench classification over the item's label set (classes:)", false,
       true, [](const std::string& p, const std::string& r, const Classes& c) {
         return metrics::classification(p, r, c); }},
      {"retrieval", "LongBench passage id (\"Paragraph N\") found in the prediction", false, false,
       [](const std::string& p, const std::string& r, const Classes&) { return metrics::retrieval(p, r); }},
      {"retrieval_zh", "LongBench passage id (\"段落N\") found in the prediction", false, false,
       [](const std::string& p, const std::string& r, const Classes&) {
         return metrics::retrieval_zh(p, r); }},
      {"count", "LongBench passage count", false, false,
       [](const std::string& p, const std::string& r, const Classes&) { return metrics::count(p, r); }},
      {"code_sim", "LongBench edit similarity of the first code line", false, false,
       [](const std::string& p, const std::string& r, const Classes&) { return metrics::code_sim(p, r); }},
  };
  // clang-format on
  return table;
}

const MetricEntry* find_metric(const std::string& name) {
  for (const MetricEntry& m : metric_table()) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

const std::vector<ParamDoc>& data_task_params() {
  static const std::vector<ParamDoc> params = {
      {"data", "", "the jsonl (or .jsonl.gz) file, instead of the definition's data:", {}},
      {"data_dir", "", "folder a relative data: of the definition is read from", {}},
      {"limit", "0", "use the first N items (0: all)", {}},
      {"max_prompt_tokens", "0", "middle-truncate context+question above this many tokens", {}},
      {"chat", "", "wrap the prompt in the chat template (default: the definition's chat:)", {}},
      {"task_file", "", "the definition file (set by the matrix; kvbench finds it by name)", {}},
      {"task_sha256", "", "expected SHA-256 of the definition (set by sweeps)", {}},
  };
  return params;
}

// ---- the task -----------------------------------------------------------------------------------
namespace {

std::string item_value_text(const JsonlItem& it, const std::string& key, const std::string& use) {
  const nlohmann::json& v = it.json().at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer() || v.is_number_unsigned() || v.is_number_float()) return v.dump();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  it.fail("field '" + key + "' (" + use + ") must be a string or a number, not " +
          (v.is_array()    ? "a list"
           : v.is_object() ? "an object"
                           : "null"));
}

std::string item_keys(const JsonlItem& it) {
  std::string keys;
  for (const auto& [k, v] : it.json().items()) keys += (keys.empty() ? "" : ", ") + k;
  return keys.empty() ? "none" : keys;
}

class DataTask : public Task {
 public:
  DataTask(DataTaskDef def, const Options& o) : def_(std::move(def)) {
    metric_ = find_metric(def_.metric);
    KVB_USAGE_CHECK(metric_) << def_.file << ": unknown metric '" << def_.metric << "'";
    const std::string file = o.get_string("data", "");
    const std::string dir = o.get_string("data_dir", "");
    KVB_USAGE_CHECK(file.empty() || dir.empty())
        << "task " << def_.name << ": give data (one file) or data_dir, not both";
    namespace fs = std::filesystem;
    if (!file.empty()) {
      path_ = file;
      option_ = "data";
    } else {
      KVB_USAGE_CHECK(!def_.data.empty()) << "task " << def_.name << " (" << def_.file
                                          << ") names no data: file; give --task-opt data=FILE";
      const bool abs = fs::path(def_.data).is_absolute();
      path_ = abs ? def_.data : ((dir.empty() ? def_.base_dir : dir) + "/" + def_.data);
      option_ = dir.empty() || abs ? "data" : "data_dir";
    }
    limit_ = o.get_int("limit", 0, 0, INT_MAX);
    max_prompt_tokens_ = o.get_int("max_prompt_tokens", 0, 0, 1 << 30);
    chat_ = o.has("chat") ? o.get_bool("chat", def_.chat) : def_.chat;
    o.get_string("task_file", "");
    const std::string sha = o.get_string("task_sha256", "");
    KVB_USAGE_CHECK(sha.empty() || sha == def_.sha256)
        << def_.file << ": the task definition changed since the sweep was planned (SHA-256 "
        << def_.sha256 << ", expected " << sha << "); rerun the sweep to plan it again";
  }

  std::string name() const override { return def_.name; }
  int version() const override { return def_.version; }
  std::vector<MetricInfo> metrics() const override { return {{def_.metric, true}}; }

  std::vector<Sample> samples(const TaskContext& ctx) override {
    JsonlReadOptions ro;
    ro.option = option_;
    ro.how_to_obtain = "task " + def_.name + " (defined in " + def_.file + ") reads " +
                       (def_.data.empty() ? std::string("the file of --task-opt data=FILE")
                                          : def_.data +
                                                ": give --task-opt data_dir=DIR (the folder "
                                                "holding it) or --task-opt data=FILE");
    ro.limit = static_cast<size_t>(limit_);
    ro.max_line_bytes = def_.max_line_bytes;
    ro.limit_hint = "if the line is meant to be this long, raise max_line_mb: in " + def_.file +
                    " (now " + std::to_string(def_.max_line_bytes >> 20) + ")";
    const JsonlFile f = read_jsonl(path_, ro);
    // Jinja templates render every item at once (in isolated processes, TaskContext::render_jinja).
    std::vector<std::string> items_json;
    auto jinja_of = [&](const PromptTemplate& t, const char* which) {
      std::vector<std::string> out;
      if (!t.is_jinja() || f.items.empty()) return out;
      KVB_USAGE_CHECK(ctx.render_jinja)
          << def_.file << ": the " << which << " template is Jinja, which this command cannot "
          << "render (an internal error: its TaskContext has no Jinja renderer)";
      if (items_json.empty()) {
        for (const JsonlItem& it : f.items) items_json.push_back(it.json().dump());
      }
      try {
        out = ctx.render_jinja(t.jinja, "the " + std::string(which) + " template of " + def_.file,
                               items_json);
      } catch (const TemplateRenderError& e) {
        f.items.at(std::min(e.item(), f.items.size() - 1)).fail(e.what());
      }
      KVB_CHECK(out.size() == f.items.size()) << def_.file << ": " << out.size()
                                              << " renders of " << f.items.size() << " items";
      return out;
    };
    const Rendered rendered{jinja_of(def_.context, "context"), jinja_of(def_.question, "question"),
                            jinja_of(def_.answer_prefix, "answer_prefix")};
    std::vector<Sample> out;
    out.reserve(f.items.size());
    UniqueSampleIds ids("the field '" + def_.id_field + "' named by id: in " + def_.file);
    for (size_t i = 0; i < f.items.size(); ++i) {
      out.push_back(sample_of(f.items[i], i, rendered));
      // Numbered ids (no id:) cannot repeat.
      if (!def_.id_field.empty()) ids.add(out.back().id, f.items[i]);
    }
    return out;
  }

  Scores score(const Sample& sample, const Prediction& prediction) const override {
    std::string pred = prediction.text;
    if (def_.first_line) {  // LongBench eval.py: prediction.lstrip('\n').split('\n')[0]
      const size_t start = std::min(pred.find_first_not_of('\n'), pred.size());
      pred = pred.substr(start, pred.find('\n', start) - start);
    }
    pred = apply_filters(def_.filters, pred);
    double best = 0;
    if (metric_->all_references) {
      best = metric_->all(pred, sample.references);
    } else {
      for (const std::string& ref : sample.references) {
        best = std::max(best, metric_->per_reference(pred, ref, sample.choices));
      }
    }
    return {{def_.metric, def_.scale * best}};
  }

 private:
  std::string render(const PromptTemplate& t, const std::string& which, const JsonlItem& it) const {
    std::string s;
    for (const PromptTemplate::Piece& p : t.pieces) {
      if (!p.field) {
        s += p.text;
      } else if (it.has(p.text)) {
        s += item_value_text(it, p.text, "named by the " + which + " template");
      } else if (!p.optional) {
        it.fail("field '" + p.text + "' named by the " + which + " template of " + def_.file +
                " is missing; the item has: " + item_keys(it) + " (fix the template, or write {" +
                p.text + "?} if the field is optional)");
      }
    }
    return s;
  }

  std::vector<std::string> references(const JsonlItem& it) const {
    const std::string& key = def_.reference;
    if (!it.has(key)) {
      it.fail("the reference field '" + key + "' (reference: in " + def_.file +
              ") is missing; the item has: " + item_keys(it));
    }
    const nlohmann::json& v = it.json().at(key);
    if (v.is_string()) return {v.get<std::string>()};
    if (!v.is_array()) {
      it.fail("the reference field '" + key + "' must be a string or a list of strings, not " +
              (v.is_object()    ? "an object"
               : v.is_boolean() ? "a boolean"
                                : "a number"));
    }
    std::vector<std::string> refs = it.str_list(key);
    if (refs.empty()) it.fail("the reference field '" + key + "' is an empty list");
    return refs;
  }

  // The Jinja templates' texts per item (empty for a template in the simple form).
  struct Rendered {
    std::vector<std::string> context, question, answer_prefix;
  };

  Sample sample_of(const JsonlItem& it, size_t index, const Rendered& r) const {
    Sample s;
    s.kind = SampleKind::kGenerate;
    s.context = def_.context.is_jinja() ? r.context.at(index) : render(def_.context, "context", it);
    s.question =
        def_.question.is_jinja() ? r.question.at(index) : render(def_.question, "question", it);
    s.answer_prefix = def_.answer_prefix.is_jinja() ? r.answer_prefix.at(index)
                                                    : render(def_.answer_prefix, "answer_prefix", it);
    s.chat = chat_;
    s.max_new_tokens = def_.max_new_tokens;
    s.max_prompt_tokens = max_prompt_tokens_;
    s.stop_strings = def_.stop_strings;
    s.references = references(it);
    if (metric_->needs_classes) {
      const auto classes = it.str_list_opt(def_.classes_field);
      if (!classes || classes->empty()) {
        it.fail("field '" + def_.classes_field + "' (classes: in " + def_.file +
                ", the label set of metric classification) is missing or empty");
      }
      s.choices = *classes;
    }
    for (const auto& [out, in] : def_.fields) {
      if (it.has(in)) s.fields[out] = item_value_text(it, in, "kept by fields:");
    }
    if (!def_.group.empty()) s.fields["task_group"] = def_.group;
    // Last, so that a broken prompt or reference is what an item is refused for first.
    if (def_.id_field.empty()) {
      s.id = def_.name + "-" + std::to_string(index);
    } else if (it.has(def_.id_field)) {
      s.id = item_value_text(it, def_.id_field, "id");
    } else {
      // Numbering this item instead would mix two kinds of id in one task's results.
      it.fail("the id field '" + def_.id_field + "' (id: in " + def_.file +
              ") is missing; the item has: " + item_keys(it) +
              " (fix id:, or drop it to number the samples " + def_.name + "-<item number>)");
    }
    return s;
  }

  DataTaskDef def_;
  const MetricEntry* metric_ = nullptr;
  std::string path_, option_;
  int limit_ = 0, max_prompt_tokens_ = 0;
  bool chat_ = true;
};

}  // namespace

std::unique_ptr<Task> make_data_task(const DataTaskDef& def, const Options& options) {
  Options opts = options;
  opts.set_kind("task option");
  auto task = std::make_unique<DataTask>(def, opts);
  opts.check_all_used("task " + def.name, data_task_params());
  return task;
}

}  // namespace kvb::tasks
