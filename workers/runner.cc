// run_sample: prompt assembly, prefill (with question placement), generation / choice scoring /
// streaming perplexity, and the unit's measurements.
#include "workers/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <new>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <unistd.h>

#include "common/error.h"
#include "workers/engine/generate.h"

namespace kvb::workers {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// log softmax(logits)[id], in double.
double log_prob(const std::vector<float>& logits, int32_t id) {
  double m = -INFINITY;
  for (float x : logits) m = std::max(m, static_cast<double>(x));
  double s = 0;
  for (float x : logits) s += std::exp(static_cast<double>(x) - m);
  return static_cast<double>(logits[id]) - m - std::log(s);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  // Nearest-rank on a 0-based index: p50 of 4 values is the 2nd smallest (index 1.5 -> 2).
  const size_t idx = std::min(v.size() - 1, static_cast<size_t>(std::ceil(p / 100.0 * v.size())) - (p > 0 ? 1 : 0));
  return v[idx];
}

// Occupancy and memory sampled after prefill compression and after each step. Under tensor
// parallelism each rank records its own heads per sample and finish() combines the ranks once
// (sums of slots and bytes, maxima of lengths, per sample), so no step pays a collective.
class Tracker {
 public:
  // Bytes as `engine` stores the cache (on the GPU: its device cache, not the host mirror).
  Tracker(const kernels::KvCache& cache, const engine::EngineBase& engine)
      : cache_(cache), engine_(engine), tp_(engine.tp()) {}
  void sample() {
    slots_.push_back(cache_.total_slots());
    longest_.push_back(cache_.max_length());
    logical_.push_back(engine_.kv_logical_bytes(cache_));
    physical_.push_back(engine_.kv_physical_bytes(cache_));
  }
  void finish(UnitMeasurements& m) {
    const auto& s = cache_.shape();
    sample();  // the final state counts toward the peaks too (the last step is sampled only here)
    int lo = INT32_MAX, hi = 0;
    for (int l = 0; l < s.num_layers; ++l) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        lo = std::min(lo, cache_.length(l, h));
        hi = std::max(hi, cache_.length(l, h));
      }
    }
    int64_t heads = s.num_kv_heads;
    if (tp_) {
      combine(slots_, [](int64_t a, int64_t b) { return a + b; });
      combine(longest_, [](int64_t a, int64_t b) { return std::max(a, b); });
      combine(logical_, [](int64_t a, int64_t b) { return a + b; });
      combine(physical_, [](int64_t a, int64_t b) { return a + b; });
      lo = -kernels::all_max(*tp_, -lo);
      hi = kernels::all_max(*tp_, hi);
      heads *= tp_->size();
    }
    const double per_head = static_cast<double>(s.num_layers) * heads;
    const size_t n = slots_.size() - 1;  // samples before the final one
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += slots_[i] / per_head;
    m.occupancy_mean = n ? sum / n : 0;
    m.occupancy_final = slots_.back() / per_head;
    m.occupancy_min_final = lo;
    m.occupancy_max_final = hi;
    m.kv_bytes_final = logical_.back();
    m.kv_bytes_peak = *std::max_element(logical_.begin(), logical_.end());
    m.kv_physical_peak = *std::max_element(physical_.begin(), physical_.end());
    m.occupancy_peak = static_cast<int>(*std::max_element(longest_.begin(), longest_.end()));
  }

 private:
  // Element-wise over the ranks' series (every rank sampled at the same points).
  template <typename Op>
  void combine(std::vector<int64_t>& v, Op op) {
    const std::vector<std::vector<int64_t>> all = kernels::all_gather_vectors(*tp_, v);
    for (size_t r = 1; r < all.size(); ++r) {
      KVB_CHECK(all[r].size() == v.size()) << "tensor-parallel ranks sampled the cache "
                                           << v.size() << " and " << all[r].size() << " times";
    }
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = all[0][i];
      for (size_t r = 1; r < all.size(); ++r) v[i] = op(v[i], all[r][i]);
    }
  }

  const kernels::KvCache& cache_;
  const engine::EngineBase& engine_;
  kernels::Communicator* tp_;
  std::vector<int64_t> slots_, longest_, logical_, physical_;
};

// The process's resident set now (/proc/self/statm: pages), in bytes; 0 when unreadable.
size_t host_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  size_t total = 0, resident = 0;
  if (!(in >> total >> resident)) return 0;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// The unit's limits, checked after the prompt and between tokens. Time: its own since t0 plus
// `before_ms`, a shared prefill it started from (that pass was its prompt too). Memory: the
// process's resident set against RunSettings::max_rss_bytes. Under tensor parallelism the ranks
// decide together (one byte all-gathered per check and limit), so that no rank stops while the
// others wait in a collective, and all of them record the same status.
void check_limits(const RunSettings& rs, std::chrono::steady_clock::time_point t0,
                  double before_ms, const tasks::Sample& s, kernels::Communicator* tp) {
  if (rs.time_limit_s > 0) {
    const double spent_ms = before_ms + ms_since(t0);
    bool over = spent_ms > rs.time_limit_s * 1000.0;
    if (tp) over = kernels::any_rank(*tp, over);
    if (over) {
      std::ostringstream msg;  // default stream format: 600, 0.5 (not 600.000000)
      msg << "sample " << s.id << ": unit time limit of " << rs.time_limit_s << " s exceeded after "
          << std::llround(spent_ms) << " ms";
      if (before_ms > 0) {
        msg << " (" << std::llround(before_ms)
            << " ms of it in the prefill shared with the sample's other policies)";
      }
      throw UnitTimeout(msg.str());
    }
  }
  if (rs.max_rss_bytes > 0) {
    const size_t rss = host_rss_bytes();
    bool over = rss > rs.max_rss_bytes;
    if (tp) over = kernels::any_rank(*tp, over);
    if (over) {
      throw UnitMemoryLimit("sample " + s.id + ": the worker's resident memory, " +
                            std::to_string(rss >> 20) + " MiB, is above the cap of " +
                            std::to_string(rs.max_rss_bytes >> 20) +
                            " MiB (--max-rss-gb; the model's weights count); lower "
                            "max_prompt_tokens, run fewer ranks per node, or raise the cap");
    }
  }
}

// A model with NaN weights (or an engine bug) gives non-finite logits; greedy decoding would then
// turn them into an empty prediction that looks like a result. Checked on every logits vector the
// runner reads (one pass over the vocabulary, next to a forward pass).
void check_finite(const std::vector<float>& logits, const tasks::Sample& s, const char* step,
                  size_t index = 0) {
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(logits[i])) {
      KVB_FAIL() << "sample " << s.id << ": the logits after " << step
                 << (index ? " " + std::to_string(index) : std::string()) << " are not finite ("
                 << "token " << i << ": " << logits[i]
                 << "); the model's weights hold NaN or Inf, or its activations overflow: "
                    "check the model file (e.g. with `kvbench eval` on one prompt)";
    }
  }
}

struct PromptTokens {
  std::vector<int32_t> head, context, question, tail;
  int truncated = 0;
  size_t size() const { return head.size() + context.size() + question.size() + tail.size(); }
};

void append(std::vector<int32_t>& to, const std::vector<int32_t>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

// Template head/tail around context + question; middle truncation of the user message
// (LongBench pred.py: keep the first and last halves) so the prompt plus max_new_tokens fits.
PromptTokens build_prompt(const LoadedModel& lm, const tasks::Sample& s, const RunSettings& rs) {
  PromptTokens p;
  ChatFrame frame;
  if (s.chat) frame = chat_frame(lm, "");
  p.head = encode_text(lm, frame.prefix, true, prompt_needs_bos(lm, s.chat));
  p.context = encode_text(lm, s.context, false, false);
  p.question = encode_text(lm, s.question, false, false);
  p.tail = encode_text(lm, frame.suffix, true, false);
  append(p.tail, encode_text(lm, s.answer_prefix, false, false));
  const int ctx_limit = lm.model->config.max_seq_len;
  const int overhead = static_cast<int>(p.head.size() + p.tail.size());
  int limit = ctx_limit - std::max(0, s.max_new_tokens) - overhead;
  // The smaller of the run's setting (CLI/YAML) and the task's own (LongBench's max_prompt_tokens).
  if (rs.max_prompt_tokens > 0) limit = std::min(limit, rs.max_prompt_tokens);
  if (s.max_prompt_tokens > 0) limit = std::min(limit, s.max_prompt_tokens);
  KVB_CHECK(limit > 0) << "sample " << s.id << ": the template (" << overhead
                       << " tokens) and max_new_tokens (" << s.max_new_tokens
                       << ") leave no room in the model's context of " << ctx_limit;
  const size_t content = p.context.size() + p.question.size();
  if (content > static_cast<size_t>(limit)) {
    std::vector<int32_t> all = p.context;
    append(all, p.question);
    const size_t first = limit / 2, last = limit - first;
    std::vector<int32_t> kept(all.begin(), all.begin() + first);
    kept.insert(kept.end(), all.end() - last, all.end());
    const size_t q = std::min(p.question.size(), last);
    p.context.assign(kept.begin(), kept.end() - q);
    p.question.assign(kept.end() - q, kept.end());
    p.truncated = static_cast<int>(content - limit);
  }
  return p;
}

}  // namespace

QuestionPlacement parse_question_placement(const std::string& s) {
  if (s == "in_prompt") return QuestionPlacement::kInPrompt;
  if (s == "after_compression") return QuestionPlacement::kAfterCompression;
  KVB_USAGE_FAIL() << "question placement '" << s << "' unknown; use in_prompt or after_compression";
}

const char* to_string(FailureStatus s) {
  switch (s) {
    case FailureStatus::kError:
      return "error";
    case FailureStatus::kTimeout:
      return "timeout";
    case FailureStatus::kOom:
      return "oom";
    case FailureStatus::kCrashed:
      return "crashed";
  }
  return "error";
}

UnitFailure current_failure(const std::string& context) {
  const std::string prefix = context.empty() ? "" : context + ": ";
  try {
    throw;
  } catch (const UnitTimeout& e) {
    return {FailureStatus::kTimeout, e.what()};
  } catch (const UnitMemoryLimit& e) {
    return {FailureStatus::kOom, e.what()};
  } catch (const std::bad_alloc& e) {
    return {FailureStatus::kOom, prefix + "out of host memory (" + e.what() +
                                     "); lower max_prompt_tokens, or run fewer ranks per "
                                     "node"};
  } catch (const std::length_error& e) {
    return {FailureStatus::kOom, prefix + "an allocation larger than the address space (" +
                                     e.what() + "); lower max_prompt_tokens"};
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kOutOfMemory) {
      return {FailureStatus::kOom, prefix + "out of device memory (" + e.what() +
                                       "); lower max_prompt_tokens or use --dtype bf16"};
    }
    return {FailureStatus::kError, e.what()};
  } catch (const std::exception& e) {
    return {FailureStatus::kError, prefix + e.what()};
  }
}

size_t host_rss_peak_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

namespace {
// One prompt prefill shared by the bundle's oneshot policies.
struct SharedPrefill {
  engine::PrefillRecord record;
  kernels::KvCache full;
  std::vector<float> logits;
  double ms = 0;
};

void split_prompt(const PromptTokens& p, const RunSettings& rs, std::vector<int32_t>* first,
                  std::vector<int32_t>* rest) {
  *first = p.head;
  append(*first, p.context);
  *rest = p.question;
  append(*rest, p.tail);
  if (rs.question == QuestionPlacement::kInPrompt || first->empty()) {
    append(*first, *rest);
    rest->clear();
  }
}

kernels::CommStats comm_stats(const engine::EngineBase& engine) {
  return engine.tp() ? engine.tp()->stats() : kernels::CommStats{};
}

// One unit being run: what its protocol reads, its policy and what it fills in.
struct Unit {
  const LoadedModel& lm;
  engine::EngineBase& engine;
  const tasks::Sample& s;
  const RunSettings& rs;
  size_t index;  // in the bundle (RunFaults, on_final_cache)
  std::unique_ptr<policies::Policy> policy;
  UnitOutput out;
  double policy_ms = 0;  // time in its policy hooks (engine.policy_ms() deltas, batch shares)
};

// Perplexity: the text streamed token by token through the decode rule, scoring each next token.
void run_perplexity(Unit& u) {
  const engine::ModelConfig& c = u.lm.model->config;
  const tasks::Sample& s = u.s;
  UnitMeasurements& m = u.out.m;
  std::vector<int32_t> ids = encode_text(u.lm, s.text, false, prompt_needs_bos(u.lm, false));
  size_t keep = ids.size();
  if (s.max_tokens > 0) keep = std::min(keep, static_cast<size_t>(s.max_tokens));
  if (keep > static_cast<size_t>(c.max_seq_len)) {
    m.truncated_tokens = static_cast<int>(keep - c.max_seq_len);  // documented: the context
    keep = c.max_seq_len;
  }
  ids.resize(keep);
  KVB_USAGE_CHECK(ids.size() >= 2) << "sample " << s.id << ": the text has " << ids.size()
                                   << " tokens; perplexity needs at least 2";
  kernels::KvCache cache = u.engine.new_cache(static_cast<int>(ids.size()), u.policy.get());
  Tracker tr(cache, u.engine);
  u.policy->begin_sequence(1);
  std::vector<double> steps;
  std::vector<float> logits;
  const kernels::CommStats comm0 = comm_stats(u.engine);
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const auto ts = std::chrono::steady_clock::now();
    u.engine.forward({&ids[t], 1}, cache, engine::LogitsMode::kLast, &logits, u.policy.get(),
                     engine::PolicyHook::kDecode);
    steps.push_back(ms_since(ts));
    check_finite(logits, s, "perplexity step", t + 1);
    u.out.prediction.token_nll.push_back(-log_prob(logits, ids[t + 1]));
    check_limits(u.rs, t0, 0, s, u.engine.tp());
    tr.sample();
  }
  m.decode_ms = ms_since(t0);
  m.tp_decode_comm = comm_stats(u.engine) - comm0;
  m.tp_decode_steps = static_cast<int>(steps.size());
  m.prompt_tokens = static_cast<int>(ids.size());
  m.prompt_sha256 = token_ids_sha256({&ids});
  m.decode_ms_p50 = percentile(steps, 50);
  m.decode_ms_p99 = percentile(steps, 99);
  m.tokens_per_s = steps.empty() ? 0 : steps.size() * 1000.0 / m.decode_ms;
  tr.finish(m);
  if (u.rs.on_final_cache) u.rs.on_final_cache(u.index, cache, *u.policy);
}

// The prompt's state after the prefill step, which choice and generation start from.
struct Prompted {
  std::vector<float> logits;  // after the prompt (and a question streamed on top)
  std::chrono::steady_clock::time_point t0;
  double shared_ms = 0;  // the shared prefill this unit started from (0: its own)
};

// The step every prompted protocol shares: the prompt into `cache` (sized by the caller for the
// prompt and what follows), by the bundle's shared prefill where the policy allows it or by its
// own, then a question placed after compression streamed through the decode rule; measures it,
// checks the logits and the unit's limits.
Prompted prefill_step(Unit& u, const PromptTokens& p, const SharedPrefill* shared,
                      kernels::KvCache& cache) {
  UnitMeasurements& m = u.out.m;
  Prompted out;
  const kernels::CommStats comm0 = comm_stats(u.engine);
  out.t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> first, rest;
  split_prompt(p, u.rs, &first, &rest);
  if (shared && engine::can_share_prefill(*u.policy)) {
    // Same cache and logits as prefill_prompt would give (the layer outputs never depend on
    // the policy); only the compression runs per policy.
    cache = shared->full;
    cache.reserve_extra(static_cast<int>(rest.size()) + std::max(1, u.s.max_new_tokens));
    u.policy->begin_sequence(static_cast<int>(first.size()));
    u.engine.apply_recorded_prefill(*u.policy, cache, shared->record);
    out.logits = shared->logits;
    out.shared_ms = shared->ms;
  } else {
    engine::prefill_prompt(u.engine, cache, first, u.policy.get(), &out.logits);
  }
  // The question on top of the compressed context, through the decode rule (per token).
  for (int32_t id : rest) {
    u.engine.forward({&id, 1}, cache, engine::LogitsMode::kLast, &out.logits, u.policy.get(),
                     engine::PolicyHook::kDecode);
  }
  m.prefill_ms = out.shared_ms + ms_since(out.t0);
  m.prefill_shared = out.shared_ms > 0;
  m.tp_prefill_comm = comm_stats(u.engine) - comm0;
  check_finite(out.logits, u.s, rest.empty() ? "the prompt's prefill" : "the question");
  if (static_cast<int>(u.index) == u.rs.faults.bad_alloc_unit) {
    throw std::bad_alloc();  // test hook (RunFaults): as if growing the cache failed
  }
  check_limits(u.rs, out.t0, out.shared_ms, u.s, u.engine.tp());
  return out;
}

// Multiple choice: each choice scored (sum of its tokens' log-probabilities) on a fork of the
// prompt's cache and a clone of the policy, so that no choice sees another; a fork holds the
// prompt's retained rows plus room for the choice, not the prompt cache's spare capacity.
void score_choices(Unit& u, const kernels::KvCache& cache, const Prompted& pre) {
  const tasks::Sample& s = u.s;
  KVB_CHECK(!s.choices.empty()) << "sample " << s.id << ": no choices";
  for (const std::string& choice : s.choices) {
    const std::vector<int32_t> ids = encode_text(u.lm, choice, false, false);
    KVB_CHECK(!ids.empty()) << "sample " << s.id << ": choice '" << choice << "' has no tokens";
    kernels::KvCache fork = cache.fork(static_cast<int>(ids.size()) - 1);
    std::unique_ptr<policies::Policy> fork_policy = u.policy->clone();
    std::vector<float> l = pre.logits;
    double ll = log_prob(l, ids[0]);
    for (size_t t = 0; t + 1 < ids.size(); ++t) {
      u.engine.forward({&ids[t], 1}, fork, engine::LogitsMode::kLast, &l, fork_policy.get(),
                       engine::PolicyHook::kDecode);
      check_finite(l, s, "choice scoring step", t + 1);
      ll += log_prob(l, ids[t + 1]);
      check_limits(u.rs, pre.t0, pre.shared_ms, s, u.engine.tp());
    }
    u.out.prediction.choice_logliks.push_back(ll);
  }
  u.out.m.ttft_ms = u.out.m.prefill_ms;
}

// A prompted unit from its prefill to its end. On the heap: the tracker refers to the cache, the
// generation to the options, on_token to both.
struct PromptedRun {
  kernels::KvCache cache;
  Tracker tr;
  Prompted pre;
  engine::GenerateOptions go;
  std::unique_ptr<engine::Generation> gen;  // null for choice scoring
  std::vector<int32_t> ids;                 // generated so far (stop strings)
  bool first_token = true;
  bool stopped = false;
  std::string stopped_text;
  kernels::CommStats comm1;
  std::chrono::steady_clock::time_point decode_t0;
  double batch_sum = 0;  // over its decode steps: the number of sequences each ran with
  PromptedRun(kernels::KvCache c, const engine::EngineBase& engine)
      : cache(std::move(c)), tr(cache, engine) {}
};

// Generation: decoding from the prompt's logits until an end token, max_new_tokens or a stop
// string; ttft_ms counts the shared prefill too. The first token is chosen here, right after the
// prompt (so ttft never waits for a batch); the caller feeds the tokens back (decode_alone, or a
// bundle's batch) and then calls finish_generation.
void start_generation(Unit& u, PromptedRun& r) {
  const tasks::Sample& s = u.s;
  r.go.max_new_tokens = s.max_new_tokens;
  r.go.sampling = u.rs.sampling;
  r.go.end_ids = u.lm.end_ids;
  auto on_token = [&u, &r](int32_t id) {
    check_limits(u.rs, r.pre.t0, r.pre.shared_ms, u.s, u.engine.tp());
    if (static_cast<int>(u.index) == u.rs.faults.timeout_unit &&
        static_cast<int>(r.ids.size()) + 1 == u.rs.faults.timeout_at_token) {
      throw UnitTimeout("sample " + u.s.id + ": test hook: timeout at token " +
                        std::to_string(u.rs.faults.timeout_at_token));
    }
    if (r.first_token) {
      u.out.m.ttft_ms = r.pre.shared_ms + ms_since(r.pre.t0);
      r.first_token = false;
    }
    r.tr.sample();
    r.ids.push_back(id);
    if (u.s.stop_strings.empty()) return true;
    const std::string text = u.lm.tokenizer->decode(r.ids, true);
    // Stop strings count only after leading whitespace (LongBench strips leading newlines
    // before cutting few-shot answers at the first "\n").
    const size_t begin = text.find_first_not_of(" \t\r\n");
    if (begin == std::string::npos) return true;
    for (const std::string& stop : u.s.stop_strings) {
      const size_t at = text.find(stop, begin);
      if (at != std::string::npos) {
        r.stopped_text = text.substr(0, at);
        r.stopped = true;
        return false;
      }
    }
    return true;
  };
  r.comm1 = comm_stats(u.engine);
  r.decode_t0 = std::chrono::steady_clock::now();
  r.gen = std::make_unique<engine::Generation>(r.pre.logits, r.go, on_token);
}

// The token to feed back next (-1: done); time spent choosing counts as decode time.
int32_t next_token(PromptedRun& r) { return r.gen->next(); }

// One sequence alone: generate_from's loop over the started generation.
void decode_alone(Unit& u, PromptedRun& r) {
  for (int32_t id = next_token(r); id >= 0; id = next_token(r)) {
    const auto ts = std::chrono::steady_clock::now();
    u.engine.forward({&id, 1}, r.cache, engine::LogitsMode::kLast, r.gen->logits(),
                     u.policy.get(), engine::PolicyHook::kDecode);
    r.gen->stepped(ms_since(ts));
    r.batch_sum += 1;
  }
}

void finish_generation(Unit& u, PromptedRun& r) {
  UnitMeasurements& m = u.out.m;
  engine::GenerateResult& res = r.gen->result();
  res.decode_ms = ms_since(r.decode_t0);
  m.tp_decode_comm = comm_stats(u.engine) - r.comm1;
  m.tp_decode_steps = res.decode_steps;
  if (r.first_token) m.ttft_ms = r.pre.shared_ms + ms_since(r.pre.t0);
  u.out.prediction.text = r.stopped ? r.stopped_text : u.lm.tokenizer->decode(res.tokens, true);
  m.generated_tokens = static_cast<int>(res.tokens.size());
  m.decode_ms = res.decode_ms;
  m.decode_ms_p50 = percentile(res.step_ms, 50);
  m.decode_ms_p99 = percentile(res.step_ms, 99);
  m.tokens_per_s = res.decode_steps > 0 ? res.decode_steps * 1000.0 / res.decode_ms : 0;
  m.decode_batch = res.decode_steps > 0 ? r.batch_sum / res.decode_steps : 1.0;
}

// Choice and generation: the prompt assembled and the prefill step; choices are scored at once,
// a generation is started (its first token chosen) and left to the caller to decode.
std::unique_ptr<PromptedRun> start_prompted(Unit& u, const SharedPrefill* shared) {
  const tasks::Sample& s = u.s;
  UnitMeasurements& m = u.out.m;
  const PromptTokens p = build_prompt(u.lm, s, u.rs);
  m.truncated_tokens = p.truncated;
  u.out.prediction.truncated_tokens = p.truncated;
  m.prompt_tokens = static_cast<int>(p.size());
  m.prompt_sha256 = token_ids_sha256({&p.head, &p.context, &p.question, &p.tail});
  u.out.prediction.prompt_tokens = m.prompt_tokens;
  m.decode_batch = 1.0;
  KVB_CHECK(p.size() > 0) << "sample " << s.id << ": empty prompt";
  auto r = std::make_unique<PromptedRun>(
      u.engine.new_cache(static_cast<int>(p.size()) + std::max(1, s.max_new_tokens),
                         u.policy.get()),
      u.engine);
  r->pre = prefill_step(u, p, shared, r->cache);
  r->tr.sample();
  if (s.kind == tasks::SampleKind::kChoice) {
    score_choices(u, r->cache, r->pre);
  } else {
    start_generation(u, *r);
  }
  return r;
}

void finish_prompted(Unit& u, PromptedRun& r) {
  if (r.gen) finish_generation(u, r);
  r.tr.finish(u.out.m);
  if (u.rs.on_final_cache) u.rs.on_final_cache(u.index, r.cache, *u.policy);
}

// A unit's policy; its protocol then runs (run_perplexity, start_prompted ...).
std::unique_ptr<Unit> make_unit(const LoadedModel& lm, engine::EngineBase& engine,
                                const tasks::Sample& s, const policies::PolicyConfig& unit_pc,
                                const RunSettings& rs, size_t unit_index) {
  policies::PolicyConfig pc = unit_pc;
  pc.tp = engine.tp();
  return std::unique_ptr<Unit>(
      new Unit{lm, engine, s, rs, unit_index, policies::make_policy(pc), {}, 0.0});
}

// What every protocol measures the same way, after it ended.
UnitOutput complete_unit(Unit& u) {
  UnitMeasurements& m = u.out.m;
  m.policy_ms = u.policy_ms;
  m.policy_state_bytes = u.policy->state_bytes();
  if (u.engine.tp()) {
    // Every rank's policy state (each holds its own heads').
    uint64_t total = 0;
    for (uint64_t b : kernels::all_gather_value<uint64_t>(*u.engine.tp(), m.policy_state_bytes)) {
      total += b;
    }
    m.policy_state_bytes = total;
  }
  m.host_rss_peak = host_rss_peak_bytes();
  m.device_peak_bytes = u.engine.device_peak_bytes();
  return std::move(u.out);
}

// Starts a unit: perplexity runs whole; a prompted unit runs up to its decode (returned unless
// it needs none). The unit's policy time so far is in u.policy_ms.
std::unique_ptr<PromptedRun> start_unit(Unit& u, const SharedPrefill* shared) {
  const double p0 = u.engine.policy_ms();
  std::unique_ptr<PromptedRun> r;
  if (u.s.kind == tasks::SampleKind::kPerplexity) {
    u.out.m.decode_batch = 1.0;
    run_perplexity(u);
  } else {
    r = start_prompted(u, shared);
  }
  u.policy_ms += u.engine.policy_ms() - p0;
  return r;
}

// One unit alone: start, decode by itself, finish.
UnitOutput run_one(const LoadedModel& lm, engine::EngineBase& engine, const tasks::Sample& s,
                   const policies::PolicyConfig& unit_pc, const RunSettings& rs,
                   const SharedPrefill* shared, size_t unit_index) {
  std::unique_ptr<Unit> u = make_unit(lm, engine, s, unit_pc, rs, unit_index);
  std::unique_ptr<PromptedRun> r = start_unit(*u, shared);
  if (r) {
    const double p0 = engine.policy_ms();
    if (r->gen) decode_alone(*u, *r);
    u->policy_ms += engine.policy_ms() - p0;
    finish_prompted(*u, *r);
  }
  return complete_unit(*u);
}

// A decoding unit of a batch.
struct Decoding {
  size_t unit;
  std::unique_ptr<Unit> u;
  std::unique_ptr<PromptedRun> r;
  int32_t next = -1;  // the token to feed back
};

}  // namespace

UnitOutput run_sample(const LoadedModel& lm, engine::EngineBase& engine,
                      const tasks::Sample& sample,
                      const policies::PolicyConfig& policy, const RunSettings& settings) {
  return run_one(lm, engine, sample, policy, settings, nullptr, 0);
}

std::vector<UnitOutput> run_bundle(const LoadedModel& lm, engine::EngineBase& engine,
                                   const tasks::Sample& s,
                                   const std::vector<policies::PolicyConfig>& policies,
                                   const RunSettings& rs, bool share_prefill,
                                   std::vector<std::optional<UnitFailure>>* failures) {
  std::vector<UnitOutput> outs(policies.size());
  if (failures) failures->assign(policies.size(), std::nullopt);
  std::unique_ptr<SharedPrefill> shared;
  if (share_prefill && s.kind != tasks::SampleKind::kPerplexity) {
    // The union of the shareable policies' prefill requests.
    policies::StatsRequest req;
    int shareable = 0;
    const PromptTokens pt = build_prompt(lm, s, rs);
    std::vector<int32_t> first, rest;
    split_prompt(pt, rs, &first, &rest);
    for (const auto& pc : policies) {
      std::unique_ptr<policies::Policy> p = policies::make_policy(pc);
      if (!engine::can_share_prefill(*p)) continue;
      ++shareable;
      const policies::StatsRequest r = p->prefill_request(static_cast<int>(first.size()));
      req.col_sums |= r.col_sums;
      req.last_w = std::max(req.last_w, r.last_w);
      req.pre_rope_keys |= r.pre_rope_keys;
    }
    if (shareable > 0) {
      shared = std::make_unique<SharedPrefill>();
      shared->record.request = req;
      shared->full = engine.new_cache(static_cast<int>(pt.size()) + std::max(1, s.max_new_tokens));
      const auto t0 = std::chrono::steady_clock::now();
      engine.forward(first, shared->full, engine::LogitsMode::kLast, &shared->logits, nullptr,
                     engine::PolicyHook::kNone, &shared->record);
      if (rs.faults.shared_prefill_sleep_ms > 0) {
        std::this_thread::sleep_for(
            std::chrono::duration<double, std::milli>(rs.faults.shared_prefill_sleep_ms));
      }
      shared->ms = ms_since(t0);
    }
  }
  const bool grouped = engine.tp() && engine.tp()->size() > 1;
  // Inside a catch block: unit i's failure recorded (the bundle goes on), or rethrown.
  auto fail = [&](size_t i) {
    try {
      throw;
    } catch (const UnitTimeout&) {
      if (!failures) throw;
      // Under tensor parallelism every rank agreed (check_limits).
      (*failures)[i] = current_failure("");
    } catch (const UnitMemoryLimit&) {
      if (!failures) throw;
      (*failures)[i] = current_failure("");  // agreed like a timeout (check_limits)
    } catch (const Error& e) {
      // Usage errors fail the bundle. Under tensor parallelism a runtime error may be this
      // rank's alone while the others wait in a collective of this unit: the caller must stop.
      if (!failures || e.kind() == ErrorKind::kUsage || grouped) throw;
      (*failures)[i] = current_failure("");
    } catch (const std::exception&) {
      // std::bad_alloc (oom) and the standard library's other errors: the unit fails, the
      // bundle goes on (its other units may need less memory).
      if (!failures || grouped) throw;
      (*failures)[i] = current_failure("sample " + s.id + ", policy " + policies[i].name);
    }
  };
  // Batched decode (RunSettings::decode_batch): generation units decode together once every
  // unit has had its prompt; never under tensor parallelism (each rank would have to agree on
  // every batch).
  const size_t batch_max = rs.decode_batch == 1 || engine.tp() ? 1
                           : rs.decode_batch == 0             ? policies.size()
                                                              : static_cast<size_t>(rs.decode_batch);
  std::vector<Decoding> decoding;
  for (size_t i = 0; i < policies.size(); ++i) {
    try {
      if (batch_max <= 1) {
        outs[i] = run_one(lm, engine, s, policies[i], rs, shared.get(), i);
        continue;
      }
      std::unique_ptr<Unit> u = make_unit(lm, engine, s, policies[i], rs, i);
      std::unique_ptr<PromptedRun> r = start_unit(*u, shared.get());
      if (r && r->gen) {
        const int32_t next = next_token(*r);  // the first token, right after the prompt
        decoding.push_back({i, std::move(u), std::move(r), next});
        continue;
      }
      if (r) finish_prompted(*u, *r);
      outs[i] = complete_unit(*u);
    } catch (...) {
      fail(i);
    }
  }
  // Ends unit d (it finished, or failed inside a catch block with `failed`).
  auto end = [&](Decoding& d, bool failed) {
    if (failed) {
      fail(d.unit);
    } else {
      finish_prompted(*d.u, *d.r);
      outs[d.unit] = complete_unit(*d.u);
    }
    d.u.reset();
  };
  for (size_t g0 = 0; g0 < decoding.size(); g0 += batch_max) {
    const size_t g1 = std::min(decoding.size(), g0 + batch_max);
    std::vector<int32_t> tokens;
    std::vector<kernels::KvCache*> caches;
    std::vector<policies::Policy*> pols;
    std::vector<size_t> who;
    std::vector<double> hook_ms;
    std::vector<float> logits;
    const size_t V = static_cast<size_t>(lm.model->config.vocab_size);
    // The group's decode time starts now, for each of its units (not when its prompt ended).
    for (size_t k = g0; k < g1; ++k) {
      if (decoding[k].u) decoding[k].r->decode_t0 = std::chrono::steady_clock::now();
    }
    while (true) {
      tokens.clear();
      caches.clear();
      pols.clear();
      who.clear();
      for (size_t k = g0; k < g1; ++k) {
        Decoding& d = decoding[k];
        if (!d.u) continue;
        if (d.next < 0) {
          try {
            end(d, false);
          } catch (...) {
            end(d, true);
          }
          continue;
        }
        tokens.push_back(d.next);
        caches.push_back(&d.r->cache);
        pols.push_back(d.u->policy.get());
        who.push_back(k);
      }
      if (who.empty()) break;
      hook_ms.assign(who.size(), 0.0);
      const auto ts = std::chrono::steady_clock::now();
      try {
        engine.decode_batch(tokens, caches, pols, &logits, hook_ms.data());
      } catch (...) {
        for (size_t k : who) end(decoding[k], true);  // the step failed for the whole batch
        continue;
      }
      const double ms = ms_since(ts);
      for (size_t j = 0; j < who.size(); ++j) {
        Decoding& d = decoding[who[j]];
        try {
          std::copy(logits.begin() + static_cast<std::ptrdiff_t>(j * V),
                    logits.begin() + static_cast<std::ptrdiff_t>((j + 1) * V),
                    d.r->gen->logits()->begin());
          d.r->gen->stepped(ms);
          d.r->batch_sum += static_cast<double>(who.size());
          d.u->policy_ms += hook_ms[j];
          d.next = next_token(*d.r);
        } catch (...) {
          end(d, true);
        }
      }
    }
  }
  return outs;
}

}  // namespace kvb::workers
