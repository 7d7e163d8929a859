// run_sample and run_bundle: a bundle's shared prefill, its units (workers/unit_run.h: the
// protocols of one unit) and the one decode loop that feeds their tokens back, alone or batched;
// typed failures. run_sample is a bundle of one.
#include "workers/runner.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <thread>

#include <unistd.h>  // sysconf
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "common/error.h"
#include "common/log.h"
#include "workers/prefix_store.h"
#include "workers/unit_run.h"

namespace kvb::workers {

using detail::build_prompt;
using detail::complete_unit;
using detail::finish_prompted;
using detail::make_unit;
using detail::ms_since;
using detail::PromptedRun;
using detail::PromptTokens;
using detail::SharedPrefill;
using detail::split_prompt;
using detail::start_unit;
using detail::Unit;

std::vector<int32_t> shared_prefill_tokens(const LoadedModel& lm, const tasks::Sample& s,
                                           const RunSettings& rs) {
  std::vector<int32_t> first, rest;
  split_prompt(build_prompt(lm, s, rs), rs, &first, &rest);
  return first;
}

std::vector<int32_t> unit_prompt_tokens(const LoadedModel& lm, const tasks::Sample& s,
                                        const RunSettings& rs, int ctx_limit, int* truncated) {
  if (s.kind == tasks::SampleKind::kPerplexity) {
    return detail::perplexity_tokens(lm, s, ctx_limit, truncated);
  }
  const detail::PromptTokens p = build_prompt(lm, s, rs, ctx_limit);
  std::vector<int32_t> ids;
  for (const auto* part : {&p.head, &p.context, &p.question, &p.tail}) {
    ids.insert(ids.end(), part->begin(), part->end());
  }
  *truncated = p.truncated;
  return ids;
}

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
    if (!e.origin().empty()) {
      KVB_LOG_DEBUG << prefix << "raised at " << e.origin();
    }
    if (e.kind() == ErrorKind::kOutOfMemory &&
        std::string_view(e.what()).starts_with("python policy ")) {
      return {FailureStatus::kOom, e.what()};  // a MemoryError in a policy's Python: says so
    }
    if (e.kind() == ErrorKind::kOutOfMemory) {
      return {FailureStatus::kOom, prefix + "out of device memory (" + e.what() +
                                       "); lower max_prompt_tokens or use --dtype bf16"};
    }
    return {FailureStatus::kError, e.what()};
  } catch (const std::exception& e) {
    return {FailureStatus::kError, prefix + e.what()};
  } catch (...) {
    // A library (or a Python policy's interpreter) may throw what is not a std::exception.
    return {FailureStatus::kError,
            prefix + "an exception that is not a std::exception (it carries no message)"};
  }
}

size_t host_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  size_t total = 0, resident = 0;
  if (!(in >> total >> resident)) return 0;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

void release_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
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

// A unit whose generation has started (its first token chosen right after its prompt) and that
// the decode loop feeds back, alone or with others.
struct Decoding {
  size_t unit;  // index into run_bundle's policies
  std::unique_ptr<Unit> u;
  std::unique_ptr<PromptedRun> r;
  int32_t next = -1;  // the token to feed back (-1: the generation ended)
};

// Ends a decoding unit: it finished (`failed` false), or it failed, inside the catch block of its
// exception. Resets d.u.
using EndDecoding = std::function<void(Decoding& d, bool failed)>;

// The prompt prefilled once for every policy whose compression can start from a full prefill
// (engine::can_share_prefill); (*uses_shared)[i] marks them. Null when none can. When the pass
// alone runs past the unit time limit it stops between two layers: with `can_fail`, null is
// returned and *timeout holds the failure of every unit that would have used it; without, the
// UnitTimeout propagates.
std::unique_ptr<SharedPrefill> shared_prefill(engine::Engine& engine, const LoadedModel& lm,
                                              const tasks::Sample& s,
                                              const std::vector<policies::PolicyConfig>& policies,
                                              const RunSettings& rs, bool can_fail,
                                              std::vector<char>* uses_shared,
                                              std::optional<UnitFailure>* timeout) {
  // The union of the shareable policies' prefill requests.
  policies::StatsRequest req;
  int shareable = 0;
  const PromptTokens pt = build_prompt(lm, s, rs);
  std::vector<int32_t> first, rest;
  split_prompt(pt, rs, &first, &rest);
  for (size_t i = 0; i < policies.size(); ++i) {
    std::unique_ptr<policies::Policy> p = policies::make_policy(policies[i]);
    if (!engine::can_share_prefill(*p)) continue;
    detail::hand_question(*p, pt, rest);
    (*uses_shared)[i] = 1;
    ++shareable;
    req = policies::merged(req, p->prefill_stats(static_cast<int>(first.size())));
  }
  if (shareable == 0) return nullptr;
  auto shared = std::make_unique<SharedPrefill>();
  shared->record.request = req;
  shared->full = engine.new_cache(static_cast<int>(pt.size()) + std::max(1, s.max_new_tokens));
  const auto t0 = std::chrono::steady_clock::now();
  // The pass counts toward the limit of every unit that uses it, so once it alone is past the
  // limit all of them are: it stops between two layers (the store's copies between its pieces
  // are not its time, as below).
  auto spent_ms = [&] {
    return ms_since(t0) - (rs.prefix_store ? rs.prefix_store->keep_ms() : 0.0);
  };
  try {
    std::optional<detail::LayerDeadline> deadline;
    if (rs.time_limit_s > 0) {
      deadline.emplace(engine, [&](int layer, int layers) {
        detail::check_time(rs, spent_ms(), 0, s, engine.tp(),
                           "in the prefill shared with the sample's other policies", layer,
                           layers);
      });
    }
    if (rs.prefix_store) {
      shared->reused =
          rs.prefix_store->prefill(engine, first, shared->full, &shared->record, &shared->logits);
    } else {
      engine.forward(first, shared->full, engine::LogitsMode::kLast, &shared->logits, nullptr,
                     engine::PolicyHook::kNone, &shared->record);
    }
  } catch (const UnitTimeout&) {
    // Under tensor parallelism every rank agreed (check_time).
    if (!can_fail) throw;
    *timeout = current_failure("");
    return nullptr;
  }
  if (rs.faults.shared_prefill_sleep_ms > 0) {
    std::this_thread::sleep_for(
        std::chrono::duration<double, std::milli>(rs.faults.shared_prefill_sleep_ms));
  }
  shared->ms = spent_ms();  // the prompt's forward pass, not the store's copies
  return shared;
}

// The decode loop, the only one: each step feeds every live unit of `group` its token in one
// engine pass (Engine::decode_batch with `batched`; otherwise the group is one unit, which
// steps through forward() as a unit alone always did, under tensor parallelism too), hands each
// unit its logits, the step's time and its policy's share of it, and chooses its next token,
// until every unit has ended (`end`). A step that fails fails every unit in it; a unit whose own
// part fails ends alone. The group's decode time starts here, for each of its units.
void decode(engine::Engine& engine, size_t vocab, std::span<Decoding> group, bool batched,
            const EndDecoding& end) {
  KVB_ASSERT(batched || group.size() == 1);
  std::vector<int32_t> tokens;
  std::vector<kernels::KvCache*> caches;
  std::vector<policies::Policy*> pols;
  std::vector<size_t> who;
  std::vector<double> hook_ms;
  std::vector<float> batch_logits;  // [who, vocab] (a unit alone writes its own logits)
  for (Decoding& d : group) {
    if (d.u) d.r->decode_t0 = std::chrono::steady_clock::now();
  }
  while (true) {
    tokens.clear();
    caches.clear();
    pols.clear();
    who.clear();
    for (size_t k = 0; k < group.size(); ++k) {
      Decoding& d = group[k];
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
      if (batched) {
        engine.decode_batch(tokens, caches, pols, &batch_logits, hook_ms.data());
      } else {
        const double p0 = engine.policy_ms();
        engine.forward({&tokens[0], 1}, *caches[0], engine::LogitsMode::kLast,
                       group[who[0]].r->gen->logits(), pols[0], engine::PolicyHook::kDecode);
        hook_ms[0] = engine.policy_ms() - p0;
      }
    } catch (...) {
      for (size_t k : who) end(group[k], true);  // the step failed for every unit in it
      continue;
    }
    const double ms = ms_since(ts);
    for (size_t j = 0; j < who.size(); ++j) {
      Decoding& d = group[who[j]];
      try {
        if (batched) {
          std::copy(batch_logits.begin() + static_cast<std::ptrdiff_t>(j * vocab),
                    batch_logits.begin() + static_cast<std::ptrdiff_t>((j + 1) * vocab),
                    d.r->gen->logits()->begin());
        }
        d.r->gen->stepped(ms);
        d.r->batch_sum += static_cast<double>(who.size());
        d.u->policy_ms += hook_ms[j];
        d.next = d.r->gen->next();
      } catch (...) {
        end(d, true);
      }
    }
  }
}

}  // namespace

UnitOutput run_sample(const LoadedModel& lm, engine::Engine& engine,
                      const tasks::Sample& sample,
                      const policies::PolicyConfig& policy, const RunSettings& settings) {
  RunSettings alone = settings;
  alone.decode_batch = 1;  // a unit alone steps through forward()
  return std::move(run_bundle(lm, engine, sample, {policy}, alone, false, nullptr).at(0));
}

std::vector<UnitOutput> run_bundle(const LoadedModel& lm, engine::Engine& engine,
                                   const tasks::Sample& s,
                                   const std::vector<policies::PolicyConfig>& policies,
                                   const RunSettings& rs, bool share_prefill,
                                   std::vector<std::optional<UnitFailure>>* failures) {
  std::vector<UnitOutput> outs(policies.size());
  if (failures) failures->assign(policies.size(), std::nullopt);
  std::vector<char> uses_shared(policies.size(), 0);  // units that start from the shared prefill
  std::optional<UnitFailure> shared_timeout;  // the shared prefill ran past the unit time limit
  std::unique_ptr<SharedPrefill> shared;
  if (share_prefill && s.kind != tasks::SampleKind::kPerplexity) {
    shared = shared_prefill(engine, lm, s, policies, rs, failures != nullptr, &uses_shared,
                            &shared_timeout);
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
    } catch (...) {
      // std::bad_alloc (oom), the standard library's other errors and exceptions that are not
      // std::exceptions: the unit fails, the bundle goes on (its other units may need less
      // memory).
      if (!failures || grouped) throw;
      (*failures)[i] = current_failure("sample " + s.id + ", policy " + policies[i].name);
    }
  };
  auto end = [&](Decoding& d, bool failed) {
    if (failed) {
      fail(d.unit);
    } else {
      finish_prompted(*d.u, *d.r);
      outs[d.unit] = complete_unit(*d.u);
    }
    d.u.reset();
  };
  // Batched decode (RunSettings::decode_batch): generation units decode together once every
  // unit has had its prompt; never under tensor parallelism (each rank would have to agree on
  // every batch). One at a time, each unit decodes right after its prompt, start to end.
  const size_t batch_max = rs.decode_batch == 1 || engine.tp() ? 1
                           : rs.decode_batch == 0             ? policies.size()
                                                              : static_cast<size_t>(rs.decode_batch);
  const bool batched = batch_max > 1;
  const size_t vocab = static_cast<size_t>(lm.model->config.vocab_size);
  std::vector<Decoding> decoding;
  for (size_t i = 0; i < policies.size(); ++i) {
    if (shared_timeout && uses_shared[i]) {
      (*failures)[i] = shared_timeout;
      continue;
    }
    try {
      std::unique_ptr<Unit> u = make_unit(lm, engine, s, policies[i], rs, i);
      std::unique_ptr<PromptedRun> r = start_unit(*u, shared.get());
      if (r && r->gen) {
        const int32_t next = r->gen->next();  // the first token, right after the prompt
        Decoding d{i, std::move(u), std::move(r), next};
        if (batched) {
          decoding.push_back(std::move(d));
        } else {
          decode(engine, vocab, std::span<Decoding>(&d, 1), false, end);
        }
        continue;
      }
      if (r) finish_prompted(*u, *r);
      outs[i] = complete_unit(*u);
    } catch (...) {
      fail(i);
    }
  }
  for (size_t g0 = 0; g0 < decoding.size(); g0 += batch_max) {
    const size_t g1 = std::min(decoding.size(), g0 + batch_max);
    decode(engine, vocab, std::span<Decoding>(decoding.data() + g0, g1 - g0), true, end);
  }
  return outs;
}

}  // namespace kvb::workers
