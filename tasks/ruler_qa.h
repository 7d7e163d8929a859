// RULER's QA tasks qa_1 (SQuAD) and qa_2 (HotpotQA) (NVIDIA/RULER @ c3f5e3b
// scripts/data/synthetic/qa.py; template in scripts/data/synthetic/constants.py): the question's
// gold documents among distractors, as "Document i:\n<text>" blocks. The user's SQuAD v2.0 /
// HotpotQA json files are read, never bundled. Exposed for tests: the corpus readers and one
// instance at a given document count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tasks/haystack.h"

namespace kvb::tasks {

struct QaCorpus {
  struct Qa {
    std::string query;
    std::vector<std::string> outputs;
    std::vector<int64_t> context;       // gold documents (indices into docs)
    std::vector<int64_t> more_context;  // SQuAD: the article's other paragraphs
  };
  std::vector<std::string> docs;  // sorted, distinct (RULER: sorted(set(...)))
  std::vector<Qa> qas;
};
// RULER's read_squad: every paragraph context of a SQuAD json ({"data": [{"paragraphs":
// [{"context", "qas": [{"question", "answers": [{"text"}], "is_impossible"}]}]}]}), questions
// with is_impossible true left out (an absent is_impossible, as in SQuAD v1.1, counts as false).
QaCorpus read_squad_corpus(const std::string& path);
// RULER's read_hotpotqa: a list of {"question", "answer", "context": [[title, [sentences]]]};
// documents are "<title>\n<sentences joined>", every paragraph of the item is gold.
QaCorpus read_hotpotqa_corpus(const std::string& path);

// RULER's generate_input_output(index, num_docs) with its template: all_docs = the gold
// documents, then the article's other paragraphs, then distractors drawn with `rng` (RULER draws
// them from its global random state, which depends on its tokenizer's search: the set differs,
// the construction does not), or the whole corpus repeated when num_docs >= its size; then
// random.Random(seed).shuffle, reproduced exactly (tasks/py_random.h), so the gold documents land
// where RULER puts them. With num_docs below the gold count, the gold documents alone.
Generated qa_instance(const QaCorpus& corpus, int index, int64_t num_docs, uint64_t seed, Rng& rng);

}  // namespace kvb::tasks
