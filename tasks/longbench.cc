// `longbench`: the 21 LongBench v1 data sets (TASKS.md "longbench"; peers.md 2.1) read from
// LongBench's jsonl files, prompted with LongBench's templates (longbench_prompts.cc) and scored
// as LongBench/eval.py does (THUDM/LongBench @ 2e00731f): first-line cut for the few-shot sets,
// per-sample score = max over the gold answers, data-set score = 100 x mean. Chinese F1/ROUGE use
// character tokens instead of jieba words (metrics.h; samples carry zh_tokenization=char).
#include <algorithm>
#include <climits>
#include <string_view>

#include "common/error.h"
#include "tasks/jsonl.h"
#include "tasks/metrics.h"
#include "tasks/tasks.h"

namespace kvb::tasks {

namespace longbench_config {  // defined in longbench_prompts.cc
const char* prompt_template(std::string_view dataset);
int max_new_tokens(std::string_view dataset);
const std::vector<std::string>& dataset_names();
}  // namespace longbench_config

namespace {

enum class Metric {
  kQaF1,
  kQaF1Zh,
  kRougeL,
  kRougeLZh,
  kClassification,
  kRetrieval,
  kRetrievalZh,
  kCount,
  kCodeSim
};

struct DatasetRule {
  const char* dataset;
  Metric metric;
  const char* metric_name;  // LongBench's metric, without "_score"
  bool chat;                // pred.py: no chat template for the few-shot and code sets
  bool first_line;          // eval.py: prediction.lstrip('\n').split('\n')[0]
  bool zh_char_tokens;      // LongBench segments with jieba; we use characters
};

// LongBench/eval.py dataset2metric; pred.py's chat exclusions; eval.py's first-line sets.
const DatasetRule kRules[] = {
    {"narrativeqa", Metric::kQaF1, "qa_f1", true, false, false},
    {"qasper", Metric::kQaF1, "qa_f1", true, false, false},
    {"multifieldqa_en", Metric::kQaF1, "qa_f1", true, false, false},
    {"multifieldqa_zh", Metric::kQaF1Zh, "qa_f1_zh", true, false, true},
    {"hotpotqa", Metric::kQaF1, "qa_f1", true, false, false},
    {"2wikimqa", Metric::kQaF1, "qa_f1", true, false, false},
    {"musique", Metric::kQaF1, "qa_f1", true, false, false},
    {"dureader", Metric::kRougeLZh, "rouge_l_zh", true, false, true},
    {"gov_report", Metric::kRougeL, "rouge_l", true, false, false},
    {"qmsum", Metric::kRougeL, "rouge_l", true, false, false},
    {"multi_news", Metric::kRougeL, "rouge_l", true, false, false},
    {"vcsum", Metric::kRougeLZh, "rouge_l_zh", true, false, true},
    {"trec", Metric::kClassification, "classification", false, true, false},
    {"triviaqa", Metric::kQaF1, "qa_f1", false, true, false},
    {"samsum", Metric::kRougeL, "rouge_l", false, true, false},
    {"lsht", Metric::kClassification, "classification", false, true, false},
    {"passage_count", Metric::kCount, "count", true, false, false},
    {"passage_retrieval_en", Metric::kRetrieval, "retrieval", true, false, false},
    {"passage_retrieval_zh", Metric::kRetrievalZh, "retrieval_zh", true, false, false},
    {"lcc", Metric::kCodeSim, "code_sim", false, false, false},
    {"repobench-p", Metric::kCodeSim, "code_sim", false, false, false},
};

const DatasetRule& rule_for(const std::string& dataset) {
  for (const DatasetRule& r : kRules) {
    if (dataset == r.dataset) return r;
  }
  KVB_ASSERT(false) << "no scoring rule for LongBench data set " << dataset;
}

std::string length_bucket(int64_t length) {  // LongBench-E (eval.py scorer_e)
  if (length < 4000) return "0-4k";
  if (length < 8000) return "4-8k";
  return "8k+";
}

// The template split at {context}: what precedes it plus the document is the compressible
// context; the rest (instruction repeat, {input}, answer cue) is the question. Placeholders are
// filled once, never rescanned, so braces inside the data are inert (as with str.format).
void fill_prompt(const std::string& tmpl, const std::string& context, const std::string& input,
                 Sample& s) {
  const size_t at = tmpl.find("{context}");
  KVB_ASSERT(at != std::string::npos);
  s.context = tmpl.substr(0, at) + context;
  const std::string rest = tmpl.substr(at + 9);
  const size_t in = rest.find("{input}");
  s.question = in == std::string::npos ? rest : rest.substr(0, in) + input + rest.substr(in + 7);
}

double score_one(const DatasetRule& r, const std::string& pred, const std::string& ref,
                 const std::vector<std::string>& all_classes) {
  switch (r.metric) {
    case Metric::kQaF1:
      return metrics::qa_f1(pred, ref);
    case Metric::kQaF1Zh:
      return metrics::qa_f1_zh(pred, ref);
    case Metric::kRougeL:
      return metrics::rouge_l_longbench(pred, ref);
    case Metric::kRougeLZh:
      return metrics::rouge_l_zh(pred, ref);
    case Metric::kClassification:
      return metrics::classification(pred, ref, all_classes);
    case Metric::kRetrieval:
      return metrics::retrieval(pred, ref);
    case Metric::kRetrievalZh:
      return metrics::retrieval_zh(pred, ref);
    case Metric::kCount:
      return metrics::count(pred, ref);
    case Metric::kCodeSim:
      return metrics::code_sim(pred, ref);
  }
  return 0;
}

class LongBenchTask : public Task {
 public:
  explicit LongBenchTask(const Options& o) {
    const auto& names = longbench_config::dataset_names();
    dataset_ = o.get_string("dataset", "", names);
    if (dataset_.empty()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      KVB_USAGE_FAIL() << "task longbench needs --task-opt dataset=NAME, one of: " << list;
    }
    const std::string dir = o.get_string("data_dir", "");
    const std::string file = o.get_string("data", "");
    KVB_USAGE_CHECK(dir.empty() || file.empty()) << "task longbench: give data_dir (a folder of "
                                                    "<dataset>.jsonl) or data (one file), not both";
    KVB_USAGE_CHECK(!dir.empty() || !file.empty())
        << "task longbench needs its data: --task-opt data_dir=DIR (LongBench's data folder, "
           "holding "
        << dataset_ << ".jsonl) or --task-opt data=FILE";
    path_ = file.empty() ? dir + "/" + dataset_ + ".jsonl" : file;
    option_ = file.empty() ? "data_dir" : "data";
    limit_ = o.get_int("limit", 0, 0, INT_MAX);
    max_prompt_tokens_ = o.get_int("max_prompt_tokens", 0, 0, 1 << 30);
    rule_ = &rule_for(dataset_);
  }

  std::string name() const override { return "longbench"; }
  int version() const override { return 1; }
  std::vector<MetricInfo> metrics() const override { return {{rule_->metric_name, true}}; }

  std::vector<Sample> samples(const TaskContext&) override {
    JsonlReadOptions ro;
    ro.option = option_;
    ro.how_to_obtain =
        "LongBench v1 is the THUDM/LongBench Hugging Face dataset (data.zip holds one "
        "<dataset>.jsonl per data set); point data_dir at that folder";
    ro.limit = static_cast<size_t>(limit_);
    const JsonlFile f = read_jsonl(path_, ro);
    const std::string tmpl = longbench_config::prompt_template(dataset_);
    std::vector<Sample> out;
    out.reserve(f.items.size());
    UniqueSampleIds ids("key '_id', or <dataset>-<item number> without it");
    for (size_t i = 0; i < f.items.size(); ++i) {
      const JsonlItem& it = f.items[i];
      const std::string ds = it.str_or("dataset", dataset_);
      if (ds != dataset_ && ds != dataset_ + "_e") {
        it.fail("the item belongs to data set '" + ds + "', not '" + dataset_ +
                "' (task option dataset)");
      }
      Sample s;
      s.id = it.str_or("_id", dataset_ + "-" + std::to_string(i));
      ids.add(s.id, it);
      s.kind = SampleKind::kGenerate;
      fill_prompt(tmpl, it.str("context"), it.str("input"), s);
      s.chat = rule_->chat;
      s.max_new_tokens = longbench_config::max_new_tokens(dataset_);
      s.max_prompt_tokens = max_prompt_tokens_;
      if (rule_->first_line) s.stop_strings = {"\n"};
      s.references = it.str_list("answers");
      if (s.references.empty()) it.fail("key 'answers' is an empty list");
      if (rule_->metric == Metric::kClassification) {
        // The label set rides in `choices` (unused by kGenerate) so the sample scores alone.
        const auto classes = it.str_list_opt("all_classes");
        if (!classes || classes->empty()) {
          it.fail("key 'all_classes' (the label set) is required for " + dataset_);
        }
        s.choices = *classes;
      }
      s.fields["dataset"] = dataset_;
      if (const auto len = it.integer_opt("length")) {
        s.fields["length"] = std::to_string(*len);
        s.fields["length_bucket"] = length_bucket(*len);
      }
      s.fields["language"] = it.str_or("language", "");
      if (rule_->zh_char_tokens) s.fields["zh_tokenization"] = "char";
      out.push_back(std::move(s));
    }
    return out;
  }

  // Per-sample scores are already x100 so that the default aggregate (the mean) is LongBench's
  // data-set score and the harness's standard error is in the same unit.
  Scores score(const Sample& sample, const Prediction& prediction) const override {
    std::string pred = prediction.text;
    if (rule_->first_line) {
      const size_t start = std::min(pred.find_first_not_of('\n'), pred.size());
      pred = pred.substr(start, pred.find('\n', start) - start);
    }
    double best = 0;
    for (const std::string& ref : sample.references) {
      best = std::max(best, score_one(*rule_, pred, ref, sample.choices));
    }
    return {{rule_->metric_name, 100.0 * best}};
  }

 private:
  std::string dataset_, path_, option_;
  int limit_ = 0, max_prompt_tokens_ = 0;
  const DatasetRule* rule_ = nullptr;
};

}  // namespace

TaskInfo longbench_task_info() {
  return {
      "longbench",
      "LongBench v1 (THUDM): 21 data sets read from <data_dir>/<dataset>.jsonl with LongBench's "
      "templates, max new tokens, chat/no-chat split and metrics (qa_f1, rouge_l, classification, "
      "retrieval, count, code_sim; score = 100 x mean of the per-sample max over answers). "
      "Chinese F1/ROUGE (multifieldqa_zh, dureader, vcsum) use character tokens, not jieba words "
      "(field zh_tokenization=char). Fields: length, length_bucket (LongBench-E 0-4k/4-8k/8k+), "
      "language.",
      {{"dataset", "", "LongBench data set (required)", longbench_config::dataset_names()},
       {"data_dir", "", "folder holding <dataset>.jsonl (LongBench's data.zip)", {}},
       {"data", "", "one jsonl file instead of data_dir", {}},
       {"limit", "0", "use the first N items (0: all)", {}},
       {"max_prompt_tokens",
        "0",
        "middle-truncate context+question above this many tokens (0: the model's context)",
        {}}},
      [](const Options& o) { return std::make_unique<LongBenchTask>(o); }};
}

}  // namespace kvb::tasks
