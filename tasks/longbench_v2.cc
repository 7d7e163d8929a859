// `longbench_v2`: LongBench v2 multiple choice (TASKS.md "longbench_v2"). Prompt: the official
// 0-shot template (THUDM/LongBench prompts/0shot.txt; fields .strip()ped as pred.py does), sent
// through the chat template. mode=generate extracts the answer letter from up to 128 generated
// tokens (pred.py's non-CoT setting) with metrics::extract_choice_letter; mode=loglik compares the
// log-likelihoods of " A".." D" after the answer cue "The correct answer is".
#include <climits>

#include "common/error.h"
#include "tasks/jsonl.h"
#include "tasks/metrics.h"
#include "tasks/tasks.h"

namespace kvb::tasks {

namespace {

const char* const kDifficulties[] = {"easy", "hard"};
const char* const kLengths[] = {"short", "medium", "long"};

class LongBenchV2Task : public Task {
 public:
  explicit LongBenchV2Task(const Options& o) {
    path_ = o.get_string("data", "");
    KVB_USAGE_CHECK(!path_.empty())
        << "task longbench_v2 needs --task-opt data=FILE (LongBench-v2 as jsonl; 180 short items "
           "are in shared/data/longbench_v2/longbench_v2_short.jsonl)";
    loglik_ = o.get_string("mode", "generate", {"generate", "loglik"}) == "loglik";
    limit_ = o.get_int("limit", 0, 0, INT_MAX);
    max_prompt_tokens_ = o.get_int("max_prompt_tokens", 0, 0, 1 << 30);
  }

  std::string name() const override { return "longbench_v2"; }
  int version() const override { return 1; }
  std::vector<MetricInfo> metrics() const override {
    std::vector<MetricInfo> m = {{"accuracy", true}};
    for (const char* d : kDifficulties) m.push_back({std::string("accuracy_") + d, true});
    for (const char* l : kLengths) m.push_back({std::string("accuracy_") + l, true});
    return m;
  }

  std::vector<Sample> samples(const TaskContext&) override {
    JsonlReadOptions ro;
    ro.option = "data";
    ro.how_to_obtain =
        "LongBench-v2 is the THUDM/LongBench-v2 Hugging Face dataset (data.json; write one object "
        "per line)";
    ro.limit = static_cast<size_t>(limit_);
    const JsonlFile f = read_jsonl(path_, ro);
    std::vector<Sample> out;
    out.reserve(f.items.size());
    UniqueSampleIds ids("key '_id'");
    for (const JsonlItem& it : f.items) {
      Sample s;
      s.id = it.str("_id");
      ids.add(s.id, it);
      const std::string answer = it.str("answer");
      if (answer.size() != 1 || answer[0] < 'A' || answer[0] > 'D') {
        it.fail("key 'answer' must be one of A, B, C, D, not '" + answer + "'");
      }
      s.references = {answer};
      s.gold = answer[0] - 'A';
      s.fields["difficulty"] = one_of(it, "difficulty", kDifficulties);
      s.fields["length"] = one_of(it, "length", kLengths);
      s.fields["domain"] = it.str("domain");
      // prompts/0shot.txt with $DOC$, $Q$, $C_A$..$C_D$ filled in (each field stripped).
      s.context = "Please read the following text and answer the question below.\n\n<text>\n" +
                  py_strip(it.str("context")) + "\n</text>\n\n";
      s.question = "What is the correct answer to this question: " + py_strip(it.str("question")) +
                   "\nChoices:\n";
      for (char c = 'A'; c <= 'D'; ++c) {
        s.question +=
            std::string("(") + c + ") " + py_strip(it.str(std::string("choice_") + c)) + "\n";
      }
      s.question +=
          "\nFormat your response as follows: \"The correct answer is (insert answer here)\".";
      s.chat = true;
      s.max_prompt_tokens = max_prompt_tokens_;
      if (loglik_) {
        s.kind = SampleKind::kChoice;
        s.answer_prefix = "The correct answer is";
        s.choices = {" A", " B", " C", " D"};
        s.max_new_tokens = 4;  // room for a choice's tokens after the prompt
      } else {
        s.kind = SampleKind::kGenerate;
        s.max_new_tokens = 128;
      }
      out.push_back(std::move(s));
    }
    return out;
  }

  // accuracy (0/1) on every sample, plus accuracy_<difficulty> and accuracy_<length> on the
  // samples of that group only: aggregate() turns them into per-group accuracies.
  Scores score(const Sample& sample, const Prediction& prediction) const override {
    int picked = -1;
    if (sample.kind == SampleKind::kChoice) {
      const auto& ll = prediction.choice_logliks;
      KVB_CHECK(ll.size() == 4) << "sample " << sample.id << ": " << ll.size()
                                << " choice log-likelihoods, expected 4";
      picked = 0;
      for (int i = 1; i < 4; ++i) {
        if (ll[i] > ll[picked]) picked = i;  // ties: the first, as numpy argmax
      }
    } else {
      const char letter = metrics::extract_choice_letter(prediction.text);
      if (letter >= 'A' && letter <= 'D') picked = letter - 'A';
    }
    const double correct = picked == sample.gold ? 1.0 : 0.0;
    Scores s = {{"accuracy", correct}};
    for (const char* key : {"difficulty", "length"}) {
      auto it = sample.fields.find(key);
      if (it != sample.fields.end()) s["accuracy_" + it->second] = correct;
    }
    return s;
  }

  // The mean of each key over the samples that carry it: accuracy over all samples, each
  // accuracy_<group> over its group (groups without samples are absent, not 0).
  Scores aggregate(const std::vector<Scores>& per_sample) const override {
    std::map<std::string, std::pair<double, int>> acc;
    for (const Scores& s : per_sample) {
      for (const auto& [k, v] : s) {
        acc[k].first += v;
        acc[k].second += 1;
      }
    }
    Scores out;
    for (const auto& [k, sn] : acc) out[k] = sn.first / sn.second;
    return out;
  }

 private:
  template <size_t N>
  static std::string one_of(const JsonlItem& it, const std::string& key,
                            const char* const (&allowed)[N]) {
    const std::string v = it.str(key);
    std::string list;
    for (const char* a : allowed) {
      if (v == a) return v;
      list += (list.empty() ? "" : ", ") + std::string(a);
    }
    it.fail("key '" + key + "' must be one of " + list + ", not '" + v + "'");
  }

  std::string path_;
  bool loglik_ = false;
  int limit_ = 0, max_prompt_tokens_ = 0;
};

}  // namespace

TaskInfo longbench_v2_task_info() {
  return {"longbench_v2",
          "LongBench v2 multiple choice (A-D) with the official 0-shot template in the chat "
          "template; mode=generate extracts the letter from the output (128 new tokens), "
          "mode=loglik picks the most likely of \" A\"..\" D\" after \"The correct answer is\". "
          "Metrics accuracy (fraction) and accuracy_<easy|hard|short|medium|long>; fields "
          "difficulty, length, domain.",
          {{"data", "", "LongBench-v2 jsonl file (required)", {}},
           {"mode", "generate", "how the answer is chosen", {"generate", "loglik"}},
           {"limit", "0", "use the first N items (0: all)", {}},
           {"max_prompt_tokens",
            "0",
            "middle-truncate context+question above this many tokens (0: the model's context)",
            {}}},
          [](const Options& o) { return std::make_unique<LongBenchV2Task>(o); }};
}

}  // namespace kvb::tasks
