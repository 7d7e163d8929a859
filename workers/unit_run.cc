// The protocols that run one unit (workers/unit_run.h).
#include "workers/unit_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "common/error.h"
#include "workers/prefix_store.h"

namespace kvb::workers::detail {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

namespace {

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

}  // namespace

void check_time(const RunSettings& rs, double spent_ms, double before_ms, const tasks::Sample& s,
                kernels::Communicator* tp, const char* pass, int layer, int layers) {
  if (rs.time_limit_s <= 0) return;
  bool over = spent_ms > rs.time_limit_s * 1000.0;
  if (tp) over = kernels::any_rank(*tp, over);
  if (!over) return;
  std::ostringstream msg;  // default stream format: 600, 0.5 (not 600.000000)
  msg << "sample " << s.id << ": unit time limit of " << rs.time_limit_s << " s exceeded after "
      << std::llround(spent_ms) << " ms";
  if (before_ms > 0) {
    msg << " (" << std::llround(before_ms)
        << " ms of it in the prefill shared with the sample's other policies)";
  }
  if (pass) msg << "; stopped " << pass << " before layer " << layer << " of " << layers;
  throw UnitTimeout(msg.str());
}

LayerDeadline::LayerDeadline(engine::Engine& engine, engine::Engine::LayerCheck check)
    : engine_(engine) {
  KVB_CHECK(!engine.layer_check()) << "a layer check is already set on this engine";
  engine.set_layer_check(std::move(check));
}

LayerDeadline::~LayerDeadline() { engine_.set_layer_check(nullptr); }

namespace {

// The unit's limits, checked after the prompt and between tokens (its time also between the
// layers of its prompt's passes: LayerDeadline). Time: its own since t0 plus `before_ms`, a
// shared prefill it started from (that pass was its prompt too). Memory: the process's resident
// set, less what RunSettings::rss_not_charged_bytes and the prefix store hold, against
// RunSettings::max_rss_bytes. Under tensor parallelism the ranks decide together (one byte
// all-gathered per check and limit), so that no rank stops while the others wait in a
// collective, and all of them record the same status.
void check_limits(const RunSettings& rs, std::chrono::steady_clock::time_point t0,
                  double before_ms, const tasks::Sample& s, kernels::Communicator* tp) {
  check_time(rs, before_ms + ms_since(t0), before_ms, s, tp, nullptr, 0, 0);
  if (rs.max_rss_bytes > 0) {
    const size_t rss = host_rss_bytes();
    const size_t store = rs.prefix_store ? rs.prefix_store->bytes() : 0;
    const size_t not_charged = std::min(rss, rs.rss_not_charged_bytes + store);
    const size_t charged = rss - not_charged;
    bool over = charged > rs.max_rss_bytes;
    if (tp) over = kernels::any_rank(*tp, over);
    if (over) {
      // Whole MiB, or KiB below one (a tiny model's store).
      auto size = [](size_t b) {
        return b >= (size_t{1} << 20) ? std::to_string(b >> 20) + " MiB"
                                      : std::to_string((b + 1023) >> 10) + " KiB";
      };
      std::string not_counted;
      if (rs.rss_not_charged_bytes > 0) {
        not_counted += size(rs.rss_not_charged_bytes) + " that earlier models left resident";
      }
      if (store > 0) {
        not_counted += (not_counted.empty() ? "" : ", ") + size(store) + " of prefix store";
      }
      throw UnitMemoryLimit("sample " + s.id + ": the worker's resident memory, " +
                            std::to_string(charged >> 20) + " MiB, is above the cap of " +
                            std::to_string(rs.max_rss_bytes >> 20) +
                            " MiB (--max-rss-gb; the model's weights count" +
                            (not_counted.empty() ? "" : "; not counted: " + not_counted) +
                            "); lower max_prompt_tokens, run fewer ranks per node, or raise the "
                            "cap");
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

void append(std::vector<int32_t>& to, const std::vector<int32_t>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

}  // namespace

std::vector<int32_t> perplexity_tokens(const LoadedModel& lm, const tasks::Sample& s,
                                       int ctx_limit, int* truncated) {
  std::vector<int32_t> ids = encode_text(lm, s.text, false, prompt_needs_bos(lm, false));
  size_t keep = ids.size();
  if (s.max_tokens > 0) keep = std::min(keep, static_cast<size_t>(s.max_tokens));
  *truncated = 0;
  if (keep > static_cast<size_t>(ctx_limit)) {
    *truncated = static_cast<int>(keep - ctx_limit);  // documented: the context
    keep = ctx_limit;
  }
  ids.resize(keep);
  return ids;
}

PromptTokens build_prompt(const LoadedModel& lm, const tasks::Sample& s, const RunSettings& rs,
                          int ctx_limit_given) {
  PromptTokens p;
  ChatFrame frame;
  if (s.chat) frame = chat_frame(lm, "");
  p.head = encode_text(lm, frame.prefix, true, prompt_needs_bos(lm, s.chat));
  p.context = encode_text(lm, s.context, false, false);
  p.question = encode_text(lm, s.question, false, false);
  p.tail = encode_text(lm, frame.suffix, true, false);
  append(p.tail, encode_text(lm, s.answer_prefix, false, false));
  const int ctx_limit = ctx_limit_given > 0 ? ctx_limit_given : lm.model->config.max_seq_len;
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

void hand_question(policies::Policy& policy, const PromptTokens& p,
                   const std::vector<int32_t>& rest) {
  const bool in_prompt = rest.empty();
  policy.set_question_tokens(in_prompt ? static_cast<int>(p.question.size()) : 0,
                             in_prompt ? static_cast<int>(p.tail.size()) : 0);
}

namespace {

kernels::CommStats comm_stats(const engine::Engine& engine) {
  return engine.tp() ? engine.tp()->stats() : kernels::CommStats{};
}

// Perplexity: the text streamed token by token through the decode rule, scoring each next token.
void run_perplexity(Unit& u) {
  const engine::ModelConfig& c = u.lm.model->config;
  const tasks::Sample& s = u.s;
  UnitMeasurements& m = u.out.m;
  int truncated = 0;
  std::vector<int32_t> ids = perplexity_tokens(u.lm, s, c.max_seq_len, &truncated);
  if (truncated > 0) m.truncated_tokens = truncated;
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
  hand_question(*u.policy, p, rest);
  if (u.policy->reconstructs_context()) {
    // KVzip reconstructs what the prompt prefills after the chat template's head.
    u.policy->set_replay_prompt(replay_prompt(u.lm, static_cast<int>(p.head.size()), p.tail));
  }
  // The time limit between the layers of the prompt's passes too: a long prefill stops within
  // one layer of its limit instead of after the whole prompt.
  const char* pass = "in the prompt's prefill";
  std::optional<LayerDeadline> deadline;
  if (u.rs.time_limit_s > 0) {
    deadline.emplace(u.engine, [&](int layer, int layers) {
      check_time(u.rs, out.shared_ms + ms_since(out.t0), out.shared_ms, u.s, u.engine.tp(), pass,
                 layer, layers);
    });
  }
  if (shared && engine::can_share_prefill(*u.policy)) {
    // Same cache and logits as prefill_prompt would give (the layer outputs never depend on
    // the policy); only the compression runs per policy.
    u.policy->begin_sequence(static_cast<int>(first.size()));
    u.engine.apply_recorded_prefill(*u.policy, shared->full,
                                    static_cast<int>(rest.size()) + std::max(1, u.s.max_new_tokens),
                                    shared->record, cache);
    if (u.policy->reconstructs_context()) u.engine.reconstruct_context(*u.policy, cache, first);
    out.logits = shared->logits;
    out.shared_ms = shared->ms;
    m.prefill_reused = shared->reused;
  } else {
    engine::prefill_prompt(u.engine, cache, first, u.policy.get(), &out.logits);
  }
  // The question on top of the compressed context, through the decode rule (per token).
  pass = "in the question's pass";
  for (int32_t id : rest) {
    u.engine.forward({&id, 1}, cache, engine::LogitsMode::kLast, &out.logits, u.policy.get(),
                     engine::PolicyHook::kDecode);
  }
  deadline.reset();
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

// Generation: decoding from the prompt's logits until an end token, max_new_tokens or a stop
// string; ttft_ms counts the shared prefill too. The first token is chosen here, right after the
// prompt (so ttft never waits for a batch); the caller feeds the tokens back (runner.cc's decode
// loop, alone or in a bundle's batch) and then calls finish_generation.
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
  r->tr.sample();  // the prompt-sized storage counts toward kv_physical_peak
  if (s.kind == tasks::SampleKind::kChoice) {
    score_choices(u, r->cache, r->pre);  // each choice on a fork: the prompt's rows + its own
  } else {
    // What the decode needs: a bundle's units decode together, each holding only this.
    u.engine.trim_storage(r->cache, std::max(1, s.max_new_tokens));
    start_generation(u, *r);
  }
  return r;
}

}  // namespace

void finish_prompted(Unit& u, PromptedRun& r) {
  if (r.gen) finish_generation(u, r);
  r.tr.finish(u.out.m);
  if (u.rs.on_final_cache) u.rs.on_final_cache(u.index, r.cache, *u.policy);
}

std::unique_ptr<Unit> make_unit(const LoadedModel& lm, engine::Engine& engine,
                                const tasks::Sample& s, const policies::PolicyConfig& unit_pc,
                                const RunSettings& rs, size_t unit_index) {
  policies::PolicyConfig pc = unit_pc;
  pc.tp = engine.tp();
  return std::unique_ptr<Unit>(
      new Unit{lm, engine, s, rs, unit_index, policies::make_policy(pc), {}, 0.0});
}

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

}  // namespace kvb::workers::detail
