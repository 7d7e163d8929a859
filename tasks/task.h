// The task interface (TASKS.md): a task turns its data or generator into samples (prompt, what to
// generate or score, references) and scores a model's prediction with metrics that declare
// `higher_is_better`. Tasks know nothing of kernels or models: token counting comes in through
// TaskContext. Definitions are declarative: a name, a version, documented options.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/options.h"

namespace kvb::tasks {

struct MetricInfo {
  std::string name;
  bool higher_is_better = true;
};

enum class SampleKind {
  kGenerate,    // generate up to max_new_tokens, score the text
  kChoice,      // score each choice's continuation log-likelihood after the prompt
  kPerplexity,  // teacher-forced NLL of `text`, token by token through the policy
};

struct Sample {
  std::string id;  // stable across runs (part of the unit key)
  SampleKind kind = SampleKind::kGenerate;
  // The user message is context + question. `context` is what question-agnostic compression
  // (question: after_compression) compresses before `question` is prefilled on top.
  std::string context;
  std::string question;
  bool chat = true;            // wrap the user message in the model's chat template
  std::string answer_prefix;   // text after the assistant header (or after the raw prompt)
  int max_new_tokens = 32;
  // Middle-truncate context + question above this many tokens, keeping the first and last halves
  // (LongBench pred.py); the runner takes the smaller of this and its own setting. 0: no limit of
  // the task's own (the model's context still applies).
  int max_prompt_tokens = 0;
  std::vector<std::string> stop_strings;  // besides the model's end tokens, e.g. "\n"
  std::vector<std::string> references;    // gold answers (score: max over them where applicable)
  std::vector<std::string> choices;       // kChoice: continuations, e.g. " A", " B"
  int gold = -1;                          // kChoice: index of the correct choice
  std::string text;                       // kPerplexity: the text to score
  int max_tokens = 0;                     // kPerplexity: score at most this many tokens (0: all)
  // Grid coordinates and metadata (context_length, depth, difficulty, length bucket, ...): they
  // become result columns and report axes.
  std::map<std::string, std::string> fields;
};

// SHA-256 (lowercase hex) of everything the task put into the sample: the content a unit key
// holds instead of the paths of the files the task read (DESIGN.md "Work unit and its key"). Every
// member is written as its name, its byte length and its bytes, in a fixed order (fields sorted
// by name), so that no two different samples share a digest text. Editing one item of a data
// file changes that item's sample digest and no other's.
std::string sample_sha256(const Sample& s);

struct Prediction {
  std::string text;                    // kGenerate: the generated text (stop strings removed)
  std::vector<double> choice_logliks;  // kChoice: sum of log-probabilities per choice
  std::vector<double> token_nll;       // kPerplexity: NLL of token t+1 given tokens <= t
  int prompt_tokens = 0;
  int truncated_tokens = 0;  // tokens removed by middle truncation (0 if none)
};

// What a task may ask of the model without depending on it.
struct TaskContext {
  std::function<int(const std::string&)> count_tokens;  // tokens of a text (no BOS, no template)
  int max_context = 0;                                  // the model's context length
  // Renders a Jinja template over items (JSON objects' texts), in order: a data task's templates
  // in Jinja mode (tasks/data_task.h). Set where tasks are built (harness: the sandboxed minja
  // renderer, workers/tokenizer/jinja_text_template.h); unset, such a template is an error.
  std::function<std::vector<std::string>(const std::string& text, const std::string& origin,
                                         const std::vector<std::string>& items_json)>
      render_jinja;
};

// A template that failed on one item: `item` is its index in the rendered list, so that the task
// can name the data file and line.
class TemplateRenderError : public Error {
 public:
  TemplateRenderError(const std::string& what, size_t item)
      : Error(what, ErrorKind::kUsage), item_(item) {}
  size_t item() const { return item_; }

 private:
  size_t item_;
};

using Scores = std::map<std::string, double>;

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual int version() const = 0;
  virtual std::vector<MetricInfo> metrics() const = 0;
  // The task's samples in a stable order; `limit` (option) and `seed` are applied here.
  virtual std::vector<Sample> samples(const TaskContext& ctx) = 0;
  virtual Scores score(const Sample& sample, const Prediction& prediction) const = 0;
  // Aggregate over samples; default: the mean of each metric over the samples that have it.
  virtual Scores aggregate(const std::vector<Scores>& per_sample) const;
};

struct TaskInfo {
  std::string name;
  std::string description;
  std::vector<ParamDoc> params;
  std::function<std::unique_ptr<Task>(const Options&)> make;
};
const std::vector<TaskInfo>& task_registry();
const TaskInfo* find_task(const std::string& name);
// Validates the name and options (usage errors list what is allowed) and builds the task.
std::unique_ptr<Task> make_task(const std::string& name, const Options& options);

}  // namespace kvb::tasks
