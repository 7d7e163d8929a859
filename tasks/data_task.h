// Tasks defined as data (TASKS.md "Tasks defined in YAML"; issue 17): a jsonl file (gzip too), a
// prompt template over each item's fields, a reference field and a metric from `metric_table()`.
// The definition is plain data (`DataTaskDef`); harness/task_file.cc reads it from YAML, checks
// its keys with file:line errors and hands it here. Data errors name the data file, the line and
// the field (tasks/jsonl.h).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tasks/task.h"

namespace kvb::tasks {

// A prompt template: literal text and `{field}` placeholders (`{field?}`: empty when the item
// lacks the field), also written as Jinja's `{{ field }}` and `{{ field | default('') }}`;
// otherwise `{{` and `}}` are literal braces, as Python's str.format. Placeholders are filled once
// and never rescanned, so braces in the data are inert. A template with any other Jinja
// (`{{ question.strip() }}`, `{{ choices[0] }}`, `{% for %}`) is Jinja throughout (`jinja`),
// where `{field}` would be literal text and is refused.
struct PromptTemplate {
  struct Piece {
    std::string text;  // literal text, or the field name
    bool field = false;
    bool optional = false;
  };
  std::vector<Piece> pieces;
  // Jinja mode: the template uses Jinja beyond `{{ field }}` (a filter, an attribute, an index,
  // `{% %}`, `{# #}`): the whole text, rendered by TaskContext::render_jinja with lm-eval's
  // environment (StrictUndefined); `pieces` is then empty.
  std::string jinja;
  bool is_jinja() const { return !jinja.empty(); }
  bool empty() const { return pieces.empty() && jinja.empty(); }
};
// Throws a usage error "<what>" naming the position of a stray brace or a bad field name.
PromptTemplate parse_prompt_template(const std::string& text);

// One step of a definition's answer extraction (lm-eval's filter_list), applied to the
// prediction before the metric, in order:
//  - regex: every match of `pattern` (ECMAScript syntax) in the text; a match's text is its first
//    non-empty capture group, or the whole match when the pattern has no group; `group_select`
//    picks the match (0: the first, -1: the last); the result is stripped of surrounding
//    whitespace; no match (or no such index): `fallback`. As lm-eval's RegexFilter.
//  - take_first: the first response (kvbench generates one: the text as it is).
//  - lowercase, uppercase: ASCII letters.
//  - strip: surrounding whitespace removed; remove_whitespace: leading whitespace removed.
struct FilterStep {
  enum class Kind { kRegex, kTakeFirst, kLowercase, kUppercase, kStrip, kRemoveWhitespace };
  Kind kind = Kind::kTakeFirst;
  std::string pattern;
  int group_select = 0;
  std::string fallback = "[invalid]";
};
// Throws a usage error when `pattern` is not a valid ECMAScript regular expression.
void check_filter_pattern(const std::string& pattern);
// The prediction after the steps.
std::string apply_filters(const std::vector<FilterStep>& steps, const std::string& text);

// A metric a definition may name: per-sample score in [0, 1] (before the definition's `scale`).
struct MetricEntry {
  std::string name;
  std::string description;
  // The references as a whole (string_match_*), or one at a time with the max taken over them.
  bool all_references = false;
  bool needs_classes = false;  // classification: the item's label set
  double (*per_reference)(const std::string& pred, const std::string& ref,
                          const std::vector<std::string>& classes) = nullptr;
  double (*all)(const std::string& pred, const std::vector<std::string>& refs) = nullptr;
};
const std::vector<MetricEntry>& metric_table();
const MetricEntry* find_metric(const std::string& name);

struct DataTaskDef {
  std::string name;         // the task's name in results and matrices
  std::string description;  // for `kvbench ls tasks`
  std::string file;         // the definition file, for messages ("" when built in code)
  std::string sha256;       // of the definition's text, includes resolved ("" when built in code)
  int version = 1;
  std::string data;      // the data file: absolute, or relative to data_dir / the definition
  std::string base_dir;  // the definition's folder (relative `data` without data_dir)
  PromptTemplate context, question, answer_prefix;  // the prompt is context + question
  std::vector<std::string> template_sources;        // "context", "question", "answer_prefix"
  bool chat = true;
  std::string reference;  // item field: a string or a list of strings
  std::string metric;     // a metric_table() name
  double scale = 1;       // per-sample score multiplier (100: LongBench's and RULER's percent)
  int max_new_tokens = 32;
  std::vector<std::string> stop_strings;
  bool first_line = false;    // score only the first non-empty line (LongBench's few-shot sets)
  std::vector<FilterStep> filters;  // answer extraction before the metric (filter_list)
  std::string id_field;       // item field of the sample id ("": <name>-<item index>)
  std::string classes_field;  // classification: item field with the label set
  // Per-sample result fields: (result field, item field); missing item fields are left out.
  std::vector<std::pair<std::string, std::string>> fields;
  std::string group;  // task group (`ruler`): the result field task_group, for group queries
  size_t max_line_bytes = size_t{16} << 20;
};

// The options every data task takes (`kvbench ls tasks`).
const std::vector<ParamDoc>& data_task_params();
// Builds the task; options: data, data_dir, limit, max_prompt_tokens, chat, task_file (and
// task_sha256, checked against the definition's). Unknown options are usage errors.
std::unique_ptr<Task> make_data_task(const DataTaskDef& def, const Options& options);

}  // namespace kvb::tasks
