// run_sample and run_bundle: a bundle's shared prefill, its units (workers/unit_run.h: the
// protocols of one unit) and their batched decode; typed failures.
#include "workers/runner.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <new>
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
using detail::run_one;
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
  std::vector<char> uses_shared(policies.size(), 0);  // units that start from the shared prefill
  std::optional<UnitFailure> shared_timeout;  // the shared prefill ran past the unit time limit
  if (share_prefill && s.kind != tasks::SampleKind::kPerplexity) {
    // The union of the shareable policies' prefill requests.
    policies::StatsRequest req;
    int shareable = 0;
    const PromptTokens pt = build_prompt(lm, s, rs);
    std::vector<int32_t> first, rest;
    split_prompt(pt, rs, &first, &rest);
    for (size_t i = 0; i < policies.size(); ++i) {
      std::unique_ptr<policies::Policy> p = policies::make_policy(policies[i]);
      if (!engine::can_share_prefill(*p)) continue;
      uses_shared[i] = 1;
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
      // The pass counts toward the limit of every unit that uses it, so once it alone is past
      // the limit all of them are: it stops between two layers (the store's copies between its
      // pieces are not its time, as below).
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
          shared->reused = rs.prefix_store->prefill(engine, first, shared->full, &shared->record,
                                                    &shared->logits);
        } else {
          engine.forward(first, shared->full, engine::LogitsMode::kLast, &shared->logits, nullptr,
                         engine::PolicyHook::kNone, &shared->record);
        }
      } catch (const UnitTimeout&) {
        // Under tensor parallelism every rank agreed (check_time).
        if (!failures) throw;
        shared_timeout = current_failure("");
        shared.reset();
      }
      if (shared) {
        if (rs.faults.shared_prefill_sleep_ms > 0) {
          std::this_thread::sleep_for(
              std::chrono::duration<double, std::milli>(rs.faults.shared_prefill_sleep_ms));
        }
        shared->ms = spent_ms();  // the prompt's forward pass, not the store's copies
      }
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
    } catch (...) {
      // std::bad_alloc (oom), the standard library's other errors and exceptions that are not
      // std::exceptions: the unit fails, the bundle goes on (its other units may need less
      // memory).
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
    if (shared_timeout && uses_shared[i]) {
      (*failures)[i] = shared_timeout;
      continue;
    }
    try {
      if (batch_max <= 1) {
        outs[i] = run_one(lm, engine, s, policies[i], rs, shared.get(), i);
        continue;
      }
      std::unique_ptr<Unit> u = make_unit(lm, engine, s, policies[i], rs, i);
      std::unique_ptr<PromptedRun> r = start_unit(*u, shared.get());
      if (r && r->gen) {
        const int32_t next = r->gen->next();  // the first token, right after the prompt
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
          d.next = d.r->gen->next();
        } catch (...) {
          end(d, true);
        }
      }
    }
  }
  return outs;
}

}  // namespace kvb::workers
