// ruler_qa (tasks/ruler_qa.h): RULER's qa_1 / qa_2 generator over the user's SQuAD or HotpotQA
// json, scored with string_match_part.
#include "tasks/ruler_qa.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tasks/jsonl.h"
#include "tasks/py_random.h"
#include "tasks/tasks.h"

namespace kvb::tasks {

namespace {

// RULER constants.py TASKS['qa']: the template (split at {context} into context and question)
// and the answer prefix " Answer:" (ruler_samples adds the space without a chat template).
constexpr char kQaIntro[] =
    "Answer the question based on the given documents. Only give me the answer and do not output "
    "any other words.\n\nThe following are given documents.\n\n";
constexpr char kQaAfter[] =
    "\n\nAnswer the question based on the given documents. Only give me the answer and do not "
    "output any other words.\n\nQuestion: ";
constexpr char kQaAnswerPrefix[] = "Answer:";
constexpr int kQaMaxNewTokens = 32;     // tokens_to_generate
constexpr int64_t kQaIncremental = 10;  // qa.py's `incremental`: the step down per sample
constexpr size_t kMaxJsonBytes = size_t{1} << 30;

const nlohmann::json& need(const nlohmann::json& v, const char* key, const std::string& where,
                           const std::string& file) {
  if (!v.is_object() || !v.contains(key)) {
    KVB_USAGE_FAIL() << file << ": " << where << " has no key '" << key
                     << "' (is this RULER's SQuAD v2.0 / HotpotQA dev json?)";
  }
  return v.at(key);
}

const std::string& text_of(const nlohmann::json& v, const std::string& where,
                           const std::string& file) {
  if (!v.is_string()) KVB_USAGE_FAIL() << file << ": " << where << " must be a string";
  return v.get_ref<const std::string&>();
}

nlohmann::json read_json(const std::string& path, const std::string& option) {
  const std::string text =
      read_text_file(path, option,
                     "RULER downloads them with scripts/data/synthetic/json/download_qa_dataset.sh "
                     "(SQuAD v2.0 dev-v2.0.json, HotpotQA hotpot_dev_distractor_v1.json)",
                     kMaxJsonBytes);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    KVB_USAGE_FAIL() << path << ": not valid JSON (at byte " << e.byte << ")";
  }
}

// Sorted distinct documents and each one's index.
std::map<std::string, int64_t> index_docs(std::vector<std::string>& docs) {
  std::sort(docs.begin(), docs.end());  // UTF-8 byte order = Python's code point order
  docs.erase(std::unique(docs.begin(), docs.end()), docs.end());
  std::map<std::string, int64_t> idx;
  for (size_t i = 0; i < docs.size(); ++i) idx[docs[i]] = static_cast<int64_t>(i);
  return idx;
}

}  // namespace

QaCorpus read_squad_corpus(const std::string& path) {
  const nlohmann::json root = read_json(path, "file");
  const nlohmann::json& data = need(root, "data", "the top level", path);
  if (!data.is_array()) KVB_USAGE_FAIL() << path << ": 'data' must be a list of articles";
  QaCorpus c;
  for (size_t a = 0; a < data.size(); ++a) {
    for (const auto& p : need(data[a], "paragraphs", "data[" + std::to_string(a) + "]", path)) {
      c.docs.push_back(text_of(need(p, "context", "a paragraph", path), "context", path));
    }
  }
  const auto idx = index_docs(c.docs);
  for (size_t a = 0; a < data.size(); ++a) {
    const std::string where = "data[" + std::to_string(a) + "]";
    std::vector<int64_t> article;
    for (const auto& p : data[a]["paragraphs"])
      article.push_back(idx.at(p["context"].get<std::string>()));
    for (const auto& p : data[a]["paragraphs"]) {
      const int64_t own = idx.at(p["context"].get<std::string>());
      for (const auto& q : need(p, "qas", where + " paragraph", path)) {
        if (q.contains("is_impossible") && q["is_impossible"].is_boolean() &&
            q["is_impossible"].get<bool>()) {
          continue;
        }
        QaCorpus::Qa qa;
        qa.query = text_of(need(q, "question", where + " question", path), "question", path);
        for (const auto& ans : need(q, "answers", where + " question", path)) {
          qa.outputs.push_back(text_of(need(ans, "text", "an answer", path), "answer text", path));
        }
        if (qa.outputs.empty()) continue;  // RULER would score nothing against no answer
        qa.context = {own};
        for (int64_t d : article) {
          if (d != own) qa.more_context.push_back(d);
        }
        c.qas.push_back(std::move(qa));
      }
    }
  }
  KVB_USAGE_CHECK(!c.qas.empty()) << path << ": no answerable question";
  return c;
}

QaCorpus read_hotpotqa_corpus(const std::string& path) {
  const nlohmann::json root = read_json(path, "file");
  if (!root.is_array()) KVB_USAGE_FAIL() << path << ": a HotpotQA file is a list of questions";
  auto doc_of = [&](const nlohmann::json& tp, size_t i) {
    const std::string where = "item " + std::to_string(i) + " context";
    if (!tp.is_array() || tp.size() != 2 || !tp[1].is_array())
      KVB_USAGE_FAIL() << path << ": " << where << " entries must be [title, [sentences]]";
    std::string d = text_of(tp[0], where + " title", path) + "\n";
    for (const auto& s : tp[1]) d += text_of(s, where + " sentence", path);
    return d;
  };
  QaCorpus c;
  for (size_t i = 0; i < root.size(); ++i) {
    for (const auto& tp : need(root[i], "context", "item " + std::to_string(i), path)) {
      c.docs.push_back(doc_of(tp, i));
    }
  }
  const auto idx = index_docs(c.docs);
  for (size_t i = 0; i < root.size(); ++i) {
    const std::string where = "item " + std::to_string(i);
    QaCorpus::Qa qa;
    qa.query = text_of(need(root[i], "question", where, path), where + " question", path);
    qa.outputs = {text_of(need(root[i], "answer", where, path), where + " answer", path)};
    for (const auto& tp : root[i]["context"]) qa.context.push_back(idx.at(doc_of(tp, i)));
    c.qas.push_back(std::move(qa));
  }
  KVB_USAGE_CHECK(!c.qas.empty()) << path << ": no question";
  return c;
}

Generated qa_instance(const QaCorpus& c, int index, int64_t num_docs, uint64_t seed, Rng& rng) {
  const QaCorpus::Qa& q = c.qas.at(static_cast<size_t>(index));
  const auto n_docs = static_cast<int64_t>(c.docs.size());
  const auto n_gold = static_cast<int64_t>(q.context.size());
  const auto n_more = static_cast<int64_t>(q.more_context.size());
  std::vector<int64_t> all;
  if (num_docs < n_docs) {
    all = q.context;
    if (num_docs - n_gold > n_more) {
      all.insert(all.end(), q.more_context.begin(), q.more_context.end());
      std::vector<int64_t> addition;  // every other document, in index order
      std::vector<bool> used(c.docs.size(), false);
      for (int64_t d : all) used[d] = true;
      for (int64_t d = 0; d < n_docs; ++d) {
        if (!used[d]) addition.push_back(d);
      }
      const int64_t k = std::max<int64_t>(0, num_docs - n_gold - n_more);
      for (int64_t j : rng.sample(static_cast<int64_t>(addition.size()), k))
        all.push_back(addition[j]);
    } else if (num_docs > n_gold) {
      for (int64_t j : rng.sample(n_more, num_docs - n_gold)) all.push_back(q.more_context[j]);
    }
  } else {
    for (int64_t i = 0; i < num_docs; ++i) all.push_back(i % n_docs);  // (DOCS * repeats)[:n]
  }
  const std::vector<size_t> order = py::shuffle_order(seed, all.size());
  Generated g;
  std::string docs;
  for (size_t j = 0; j < order.size(); ++j) {
    docs += (j ? "\n\n" : "") + std::string("Document ") + std::to_string(j + 1) + ":\n" +
            c.docs[all[order[j]]];
  }
  g.parts.context = kQaIntro + docs;
  g.parts.question = kQaAfter + q.query;
  g.parts.answer_prefix = kQaAnswerPrefix;
  g.answers = q.outputs;
  return g;
}

TaskInfo ruler_qa_task_info() {
  TaskInfo t;
  t.name = "ruler_qa";
  t.description =
      "RULER qa_1 (dataset=squad) / qa_2 (dataset=hotpotqa): a question over its gold documents "
      "among distractors from the user's SQuAD v2.0 / HotpotQA json (never bundled), RULER's "
      "template, document order from random.Random(seed).shuffle as RULER; string_match_part";
  t.params = ruler_common_params();
  t.params.push_back(
      {"dataset", "", "squad (qa_1) or hotpotqa (qa_2) (required)", {"squad", "hotpotqa"}});
  t.params.push_back({"file", "", "the SQuAD dev-v2.0.json or HotpotQA dev json (required)", {}});
  t.make = [](const Options& o) -> std::unique_ptr<Task> {
    const RulerCommon c = read_ruler_common(o);
    const std::string dataset = o.get_string("dataset", "", {"squad", "hotpotqa"});
    const std::string file = o.get_string("file", "");
    KVB_USAGE_CHECK(!dataset.empty() && !file.empty())
        << "task ruler_qa needs --task-opt dataset=squad|hotpotqa and --task-opt file=JSON (RULER "
           "downloads them with scripts/data/synthetic/json/download_qa_dataset.sh)";
    auto gen = [c, dataset, file](const TaskContext& ctx) {
      auto corpus = std::make_shared<const QaCorpus>(
          dataset == "squad" ? read_squad_corpus(file) : read_hotpotqa_corpus(file));
      const std::string name = dataset == "squad" ? "ruler_qa squad" : "ruler_qa hotpotqa";
      KVB_USAGE_CHECK(static_cast<size_t>(c.num_samples) <= corpus->qas.size() ||
                      (c.limit > 0 && static_cast<size_t>(c.limit) <= corpus->qas.size()))
          << file << " holds " << corpus->qas.size() << " answerable questions, fewer than "
          << "num_samples=" << c.num_samples;
      auto build = [corpus, c](int i, int64_t n) {
        Rng rng(static_cast<uint64_t>(c.seed), mix_stream({i, n}));
        return qa_instance(*corpus, i, n, static_cast<uint64_t>(c.seed), rng);
      };
      std::vector<Sample> out =
          ruler_samples(ctx, c, name, kQaMaxNewTokens, 1, build, kQaIncremental);
      for (Sample& s : out) s.fields["dataset"] = dataset;
      return out;
    };
    return std::make_unique<StringMatchTask>("ruler_qa", 1, gen, /*match_part=*/true);
  };
  return t;
}

}  // namespace kvb::tasks
