// BundleRunner (harness/bundle_runner.h): model loading and caching, placement groups, fault
// hooks, scoring, and the typed failure of every unit that did not finish.
#include "harness/bundle_runner.h"

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "harness/sweep_plan.h"
#include "harness/sweep_prefix_share.h"
#include "harness/sweep_tp.h"
#include "harness/task_file.h"
#include "kernels/policies/policy.h"
#include "workers/engine/tensor_parallel.h"

namespace kvb::harness {

results::UnitStatus unit_status(workers::FailureStatus s) {
  switch (s) {
    case workers::FailureStatus::kTimeout:
      return results::UnitStatus::kTimeout;
    case workers::FailureStatus::kOom:
      return results::UnitStatus::kOom;
    case workers::FailureStatus::kCrashed:
      return results::UnitStatus::kCrashed;
    case workers::FailureStatus::kError:
      break;
  }
  return results::UnitStatus::kError;
}

bool is_usage_error(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.kind() == ErrorKind::kUsage;
  } catch (...) {
    return false;
  }
}

BundleRunner::BundleRunner(const SweepConfig& cfg, bool share, engine::Device device,
                           engine::DType dtype, int gpu, kernels::Communicator* tp)
    : cfg_(cfg), share_(share), device_(device), dtype_(dtype), gpu_(gpu), tp_(tp) {
  for (const TaskEntry& te : cfg_.tasks) {
    tasks_.push_back(make_any_task(te.name, keyed_task_options(cfg_, te)));
  }
}

ResolvedBundle BundleRunner::resolve(const WireBundle& b) {
  KVB_USAGE_CHECK(b.model >= 0 && b.model < static_cast<int>(cfg_.models.size()) && b.task >= 0 &&
                  b.task < static_cast<int>(tasks_.size()))
      << "bundle of sample " << b.sample.id << ": model " << b.model << " or task " << b.task
      << " is not in config " << cfg_.path << " (" << cfg_.models.size() << " models, "
      << tasks_.size() << " tasks); every rank must read the same config";
  ResolvedBundle rb{b, *tasks_[b.task], {}};
  for (const WireUnit& u : b.units) {
    policies::require_policy(u.policy);
    policies::PolicyConfig pc;
    pc.name = u.policy;
    pc.kv_budget = u.kv_budget;
    pc.budget_fraction = u.budget_fraction;
    pc.options = policies::PolicyOptions(u.policy_options);
    pc.seed = u.seed;
    rb.policies.push_back(pc);
  }
  return rb;
}

const workers::LoadedModel& BundleRunner::model(int index) {
  if (loaded_model_ == index) {
    if (max_rss_bytes_ > 0) workers::release_free_memory();  // what earlier bundles freed
    return lm_;
  }
  // The previous model goes first (its weights, engine and prefix store), and the heap's free
  // memory back to the system, so that what it leaves resident can be measured and is not
  // charged to this model's units (--max-rss-gb).
  loaded_model_ = -1;
  engine_.reset();
  prefixes_.reset();
  lm_ = workers::LoadedModel();
  workers::release_free_memory();
  const size_t rss = workers::host_rss_bytes();
  if (!rss_measured_) {
    rss_before_models_ = rss;
    rss_measured_ = true;
  }
  rss_left_by_models_ = rss > rss_before_models_ ? rss - rss_before_models_ : 0;
  if (max_rss_bytes_ > 0 && rss_left_by_models_ >= (size_t{1} << 20)) {
    KVB_LOG_INFO << "--max-rss-gb: " << (rss_left_by_models_ >> 20)
                 << " MiB that earlier models left resident are not charged to the units of "
                 << cfg_.models[index].name;
  }
  lm_ = workers::load_model_and_tokenizer(cfg_.models[index].path, cfg_.models[index].tokenizer,
                                         dtype_ == engine::DType::kNative);
  if (tp_) *lm_.model = engine::shard_model(*lm_.model, tp_->rank(), tp_->size());
  engine_ = engine::make_engine(*lm_.model, device_, dtype_, gpu_, tp_);
  if (device_ == engine::Device::kCuda) {
    KVB_LOG_INFO << "model " << lm_.model->config.name << " on " << engine_->device_description()
                 << " (" << engine::dtype_name(dtype_) << ")";
  }
  loaded_model_ = index;
  const int mib = prefix_cache_mib_ >= 0 ? prefix_cache_mib_ : cfg_.prefix_cache_mib;
  prefixes_ = std::make_unique<workers::PrefixStore>(
      share_ && workers::PrefixStore::serves(*engine_) ? static_cast<size_t>(mib) << 20 : 0);
  planned_.clear();
  return lm_;
}

std::vector<results::UnitResult> BundleRunner::run(const ResolvedBundle& rb) {
  const WireBundle& b = rb.wire;
  tasks::Task& task = rb.task;
  model(b.model);
  import_offered(b.model);
  const engine::ModelConfig& c = lm_.model->config;
  std::vector<results::UnitResult> out(b.units.size());
  // Units of one bundle may differ in question placement: run each placement as a group.
  std::map<std::string, std::vector<size_t>> by_question;
  for (size_t i = 0; i < b.units.size(); ++i) by_question[b.units[i].question].push_back(i);
  for (const auto& [q, idx] : by_question) {
    workers::RunSettings rs;
    rs.question = workers::parse_question_placement(q);
    rs.max_prompt_tokens = cfg_.max_prompt_tokens;
    rs.time_limit_s = cfg_.unit_time_limit_s;
    rs.max_rss_bytes = max_rss_bytes_;
    rs.rss_not_charged_bytes = rss_left_by_models_;
    rs.decode_batch = decode_batch_ >= 0 ? decode_batch_ : cfg_.decode_batch;
    rs.sampling = {cfg_.generation.temperature, cfg_.generation.top_k, cfg_.generation.top_p, 0};
    if (prefixes_->max_bytes() > 0) {
      // The store learns every prompt of this (task, question placement) once, so that a
      // prefill checkpoints where a later prompt branches off.
      if (planned_.insert({b.task, q}).second) learn_prompts(task, rs);
      rs.prefix_store = prefixes_.get();
    }
    if (const char* dir = std::getenv("KVB_DUMP_KEEPSETS")) {
      rs.on_final_cache = [&, dir](size_t k, const kernels::KvCache& cache,
                                   const policies::Policy& policy) {
        dump_keep_set(dir, b.units[idx[k]].key, tp_ ? tp_->rank() : 0, cache, policy);
      };
    }
    std::vector<policies::PolicyConfig> group;
    for (size_t i : idx) {
      policies::PolicyConfig pc = rb.policies[i];
      pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len,
                  c.has_sliding_layers()};
      group.push_back(pc);
    }
    faults_.crash_if(b.sample.id);
    rs.faults.bad_alloc_unit = -1;
    for (size_t k = 0; k < idx.size(); ++k) {
      const WireUnit& u = b.units[idx[k]];
      if (faults_.bad_alloc_in(b.sample.id, u.policy, u.kv_budget)) {
        rs.faults.bad_alloc_unit = static_cast<int>(k);
      }
    }
    rs.faults.shared_prefill_sleep_ms = faults_.shared_prefill_sleep_ms;
    std::vector<std::optional<workers::UnitFailure>> failures;
    std::vector<workers::UnitOutput> outs;
    try {
      faults_.throw_if(b.sample.id, tp_ ? tp_->rank() : 0);
      outs = workers::run_bundle(lm_, *engine_, b.sample, group, rs, share_, &failures);
    } catch (...) {
      // Whatever escaped run_bundle (the shared prefill, a usage error, a tensor-parallel
      // rank's failure) fails every unit of this placement group with its type; the rank goes
      // on with its next bundle.
      const workers::UnitFailure f = workers::current_failure("sample " + b.sample.id);
      // A tensor-parallel rank's runtime failure (out of memory, a device fault) may be its
      // alone: the group's other ranks then wait in a collective it will never join. Stop the
      // job (cmd_sweep aborts it); the bundle's units stay in flight for --resume, which
      // retries them and marks them crashed after a second time. Usage errors come from the
      // config and the model, the same on every rank, and fail only the bundle's units.
      if (tp_ && tp_->size() > 1 && !is_usage_error(std::current_exception())) {
        throw Error("worker group rank " + std::to_string(tp_->rank()) + "/" +
                    std::to_string(tp_->size()) + ", sample " + b.sample.id + ": " + f.message +
                    "; the group's other ranks may be waiting for this one, so the job stops "
                    "(rerun with --resume: the bundle's units are retried once, then marked "
                    "crashed)");
      }
      outs.assign(group.size(), {});
      failures.assign(group.size(), f);
    }
    for (size_t k = 0; k < idx.size(); ++k) {
      const WireUnit& u = b.units[idx[k]];
      results::UnitResult& r = out[idx[k]];
      r.unit_key = u.key;
      if (policies::budgeted(u.policy)) r.kv_budget = u.kv_budget;
      if (failures[k]) {
        r.status = unit_status(failures[k]->status);
        r.error = failures[k]->message;
        continue;
      }
      const workers::UnitOutput& o = outs[k];
      try {
        const tasks::Scores sc = task.score(b.sample, o.prediction);
        for (const auto& mi : task.metrics()) {
          if (sc.count(mi.name)) r.metrics.push_back({mi.name, sc.at(mi.name), mi.higher_is_better});
        }
        for (const auto& [name, v] : sc) {
          bool declared = false;
          for (const auto& mi : task.metrics()) declared |= mi.name == name;
          if (!declared) r.metrics.push_back({name, v, true});
        }
      } catch (const std::exception& e) {
        r.status = results::UnitStatus::kError;
        r.error = std::string("scoring: ") + e.what();
      }
      const workers::UnitMeasurements& m = o.m;
      r.measurements = to_store(m);
      r.prediction = results::PredictionRow{o.prediction.text, b.sample.references};
      if (tp_ && tp_->rank() == 0) {
        KVB_LOG_INFO << tp_traffic_line(u.key, m);
      }
    }
  }
  return out;
}

void BundleRunner::learn_prompts(tasks::Task& task, const workers::RunSettings& rs) {
  tasks::TaskContext ctx;
  ctx.render_jinja = render_task_jinja;  // a definition's Jinja templates (sandboxed)
  ctx.count_tokens = [&](const std::string& t) {
    return static_cast<int>(workers::encode_text(lm_, t, false, false).size());
  };
  ctx.max_context = lm_.model->config.max_seq_len;
  // Only an optimisation: a sample whose prompt cannot be built (its own bundle will say why)
  // or a task that fails here leaves the store knowing fewer prompts, never fails a bundle.
  std::vector<tasks::Sample> samples;
  try {
    samples = task.samples(ctx);
  } catch (const std::exception& e) {
    KVB_LOG_WARN << "prefix reuse: the samples of task " << task.name()
                 << " could not be listed (" << e.what() << "); its prefills start from nothing";
    return;
  }
  for (tasks::Sample& s : samples) {
    if (s.kind == tasks::SampleKind::kPerplexity) continue;  // no shared prefill
    if (cfg_.generation.max_new_tokens > 0) s.max_new_tokens = cfg_.generation.max_new_tokens;
    try {
      prefixes_->add_prompt(workers::shared_prefill_tokens(lm_, s, rs));
    } catch (const std::exception&) {
      continue;
    }
  }
}

void BundleRunner::offer_prefix(std::string message) { offered_.push_back(std::move(message)); }

void BundleRunner::import_offered(int model) {
  std::vector<std::string> offered = std::move(offered_);
  offered_.clear();
  if (!prefixes_ || prefixes_->max_bytes() == 0) return;
  for (const std::string& m : offered) {
    try {
      const PrefixMessage pm = parse_prefix_message(m);
      if (pm.model != model) continue;  // rank 0 sends only the bundle's model's
      const auto t0 = std::chrono::steady_clock::now();
      const bool kept = prefixes_->import(*engine_, pm.body);
      KVB_LOG_DEBUG << "another worker's prefix (" << (pm.body.size() >> 20) << " MiB) "
                    << (kept ? "imported" : "not kept (above --prefix-cache-mib)") << " in "
                    << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                 t0)
                           .count()
                    << " ms";
    } catch (const Error& e) {
      KVB_LOG_WARN << "a prefix another worker shared was not used: " << e.what();
    }
  }
}

std::vector<std::string> BundleRunner::take_kept_prefixes() {
  if (!prefixes_ || loaded_model_ < 0) return {};
  return prefixes_->take_kept(prefix_message(loaded_model_, ""));
}

std::vector<results::UnitResult> BundleRunner::run_or_fail(const WireBundle& b) {
  try {
    return run(resolve(b));
  } catch (...) {
    if ((tp_ && tp_->size() > 1) || is_usage_error(std::current_exception())) throw;
    const workers::UnitFailure f = workers::current_failure("sample " + b.sample.id);
    KVB_LOG_WARN << "bundle of sample " << b.sample.id << " failed: " << f.message;
    loaded_model_ = -1;  // the model may be half loaded: load it again for the next bundle
    std::vector<results::UnitResult> out(b.units.size());
    for (size_t i = 0; i < b.units.size(); ++i) {
      out[i].unit_key = b.units[i].key;
      if (policies::budgeted(b.units[i].policy)) out[i].kv_budget = b.units[i].kv_budget;
      out[i].status = unit_status(f.status);
      out[i].error = f.message;
    }
    return out;
  }
}

}  // namespace kvb::harness
