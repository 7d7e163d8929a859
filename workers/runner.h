// Runs one task sample under one policy and budget on a loaded model: builds the prompt (chat
// template, answer prefix, middle truncation, question placement), prefills, generates or
// scores, and measures time and memory (TASKS.md "Measurements every unit records"). The same
// code path serves `kvbench eval` and the sweep workers.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/measurement_fields.h"
#include "kernels/policies/policy.h"
#include "tasks/task.h"
#include "workers/engine/engine.h"
#include "workers/engine/sampler.h"
#include "workers/model_session.h"

namespace kvb::workers {

enum class QuestionPlacement {
  kInPrompt,          // context + question prefilled together (policies see the question)
  kAfterCompression,  // context prefilled and compressed, then the question streamed on top
};
QuestionPlacement parse_question_placement(const std::string& s);

// A unit that ran past RunSettings::time_limit_s. Checked at the start of every forward pass of
// its prompt and between the layers of a pass over several tokens (its own prefill, each piece
// of a bundle's shared prefill), after the prompt, and between tokens; so a unit runs past its
// limit by at most the longest stretch between two checks: one layer of its prompt's pass, a
// one-token pass, the last layer with the final norm and classifier, or the compression of a
// shared prefill by its policy (on a GPU, also work the host queued before a check). A shared
// prefill counts toward every unit that used it; when it alone runs past the limit it stops,
// and every unit that would have used it ends `timeout` (the bundle's other units still run).
// Recorded as status `timeout`.
class UnitTimeout : public Error {
 public:
  using Error::Error;
};

// A unit during which the memory charged to it was above RunSettings::max_rss_bytes (`kvbench
// sweep --max-rss-gb`): the process's resident set (/proc/self/statm) less
// RunSettings::rss_not_charged_bytes (what the worker's earlier models left resident) and the
// prefix store's bytes (PrefixStore::bytes: earlier prompts' rows, bounded by its own budget).
// So the program, the model's weights, the engine's buffers and the caches alive in the bundle
// count. Checked after the prompt and between tokens. Not a hard cap: an allocation between two
// checks is not stopped (a hard cap is the kernel's: ulimit -v / prlimit --as, cgroups; what
// they refuse ends `oom` as std::bad_alloc). Recorded as status `oom`.
class UnitMemoryLimit : public Error {
 public:
  using Error::Error;
};

// How a unit failed (results' unit statuses, less those the coordinator gives: pending,
// running, ok). `crashed` is never returned by the runner: a worker that dies cannot report; it is
// here so that the harness speaks one vocabulary.
enum class FailureStatus { kError, kTimeout, kOom, kCrashed };
const char* to_string(FailureStatus s);  // "error", "timeout", "oom", "crashed"

struct UnitFailure {
  FailureStatus status = FailureStatus::kError;
  std::string message;  // names the sample (and the step, where one applies)
};

// Classifies the exception in flight; call only inside a catch block. UnitTimeout -> timeout;
// UnitMemoryLimit -> oom; std::bad_alloc and std::length_error (what a huge std::vector allocation throws) -> oom; a
// kvb::Error of kind kOutOfMemory (a failed device allocation) -> oom; any other std::exception
// (kvb::Error included) -> error, its what() the message; anything else (not a std::exception)
// -> error, saying so. `context` (e.g.
// "sample X, policy h2o") prefixes the message of exceptions that do not carry it.
UnitFailure current_failure(const std::string& context);

// Test hooks (harness: KVB_FAULT_* in README "Fault injection"), off by default.
struct RunFaults {
  int bad_alloc_unit = -1;         // unit index that throws std::bad_alloc after its prefill
  double shared_prefill_sleep_ms = 0;  // added inside the timed shared prefill (a slow prompt)
  int timeout_unit = -1;           // unit index that ends `timeout` when it chooses its token
  int timeout_at_token = 0;        //   number timeout_at_token (1-based), batched or not
};

class PrefixStore;

struct RunSettings {
  int max_prompt_tokens = 0;  // middle-truncate the user message above this (0: fit the context)
  double time_limit_s = 0;    // per unit (0: none)
  size_t max_rss_bytes = 0;   // the memory charged to a unit, per check (0: none; UnitMemoryLimit)
  // Resident bytes the memory cap does not charge to units: what the worker's earlier models
  // left resident (harness/bundle_runner.h measures it when a model is loaded).
  size_t rss_not_charged_bytes = 0;
  // run_bundle: how many generation units of a bundle decode together (Engine::decode_batch;
  // `kvbench sweep --decode-batch`): 1 one at a time (each unit alone, start to end), 0 all of
  // them, N at most N. The tokens, scores and caches are the same bits either way; the decode
  // times are the batch's (UnitMeasurements::decode_batch records the batch size). Not under
  // tensor parallelism. The bundle's decoding units hold their caches at once.
  int decode_batch = 1;
  QuestionPlacement question = QuestionPlacement::kInPrompt;
  // run_bundle's shared prefill starts from a prefix an earlier prompt of this store computed
  // and keeps its own for later ones (workers/prefix_store.h; null: a prefill of its own).
  // Results are the same bits; prefill_ms falls, UnitMeasurements::prefill_reused says by how
  // many tokens. The store must outlive the call and belong to this engine.
  PrefixStore* prefix_store = nullptr;
  engine::SamplingParams sampling;  // greedy by default
  // Called with each unit's final cache (index into run_bundle's policies; 0 for run_sample):
  // after generation, after the prompt for choice scoring, after the stream for perplexity.
  // Under tensor parallelism every rank calls it with its own heads. Tests dump keep-sets here.
  std::function<void(size_t unit, const kernels::KvCache& cache, const policies::Policy& policy)>
      on_final_cache;
  RunFaults faults;
};

struct UnitMeasurements {
  // The stored fields, one per line of common/measurement_fields.h (prompt_tokens, ...,
  // prefill_shared); see the comments there. device_peak_bytes is the engine's since
  // construction (Engine::device_peak_bytes; 0 on the CPU, stored as NULL): a process's units
  // share one engine.
#define KVB_WORKER_MEASUREMENT_FIELD(name, ctype, kind) ctype name{};
  KVB_MEASUREMENT_FIELDS(KVB_WORKER_MEASUREMENT_FIELD)
#undef KVB_WORKER_MEASUREMENT_FIELD
  // Not stored (logged by tensor-parallel leaders). Tensor parallelism (engine.tp()): this
  // rank's collectives during the prompt (prefill and a question streamed after compression) and
  // during the decode steps (generation or the perplexity stream), and the number of decode
  // steps. Zero without a group.
  kernels::CommStats tp_prefill_comm, tp_decode_comm;
  int tp_decode_steps = 0;
};

struct UnitOutput {
  tasks::Prediction prediction;
  UnitMeasurements m;
};

// Precondition: `engine` was built on lm.model. Under tensor parallelism (engine.tp()), every
// rank of the group runs the same call on its shard; policies get the group (PolicyConfig::tp),
// measurements are the group's (KV bytes and occupancy over all heads; times of this rank), the
// unit time limit is decided together (any rank over the limit stops every rank). Throws
// kvb::Error on bad samples (e.g. a prompt that cannot fit) and on logits that are not finite
// (NaN or infinite: a broken model; the message names the step) — callers record that as the
// unit's error.
UnitOutput run_sample(const LoadedModel& lm, engine::Engine& engine,
                      const tasks::Sample& sample,
                      const policies::PolicyConfig& policy, const RunSettings& settings);

// The tokens run_bundle's shared prefill of sample `s` runs under `settings` (the chat template,
// truncation and question placement applied): what a PrefixStore learns of the prompts to come.
std::vector<int32_t> shared_prefill_tokens(const LoadedModel& lm, const tasks::Sample& s,
                                           const RunSettings& settings);

// The token ids a unit of sample `s` feeds the model, whose prompt_sha256 the unit stores
// (token_ids_sha256 of them): generation and choice, the prompt before the first generated token
// or the choices (chat template, BOS, middle truncation); perplexity, the scored stream.
// `ctx_limit`: the model's context (a tokenizer-only `lm` has no config). `*truncated`: tokens
// cut to fit.
std::vector<int32_t> unit_prompt_tokens(const LoadedModel& lm, const tasks::Sample& s,
                                        const RunSettings& settings, int ctx_limit,
                                        int* truncated);

// Runs one sample under several policies (a bundle), prefilling the prompt once for every policy
// whose compression can start from a shared full prefill (engine::can_share_prefill); the others
// run their own prefill. Results equal run_sample's for each policy, bit for bit; the shared pass
// counts toward every unit that used it (prefill_ms, ttft_ms and the unit time limit); one that
// alone runs past the limit stops between two layers and fails every unit that would have used
// it with UnitTimeout (the others run). With
// `failures` (one entry per policy; empty for a unit that finished), a unit that fails gets its
// typed failure there (current_failure) and the others still run; without, it propagates. Usage
// errors propagate always; so does every failure under a tensor-parallel group of more than one
// rank (the failure may be this rank's alone while the others wait in a collective).
std::vector<UnitOutput> run_bundle(const LoadedModel& lm, engine::Engine& engine,
                                   const tasks::Sample& sample,
                                   const std::vector<policies::PolicyConfig>& policies,
                                   const RunSettings& settings, bool share_prefill = true,
                                   std::vector<std::optional<UnitFailure>>* failures = nullptr);

// Resident-set high-water mark of this process, bytes (0 where /proc is unavailable).
size_t host_rss_peak_bytes();
// The process's resident set now (/proc/self/statm), bytes (0 where /proc is unavailable).
size_t host_rss_bytes();
// Returns the heap's free memory to the system (glibc malloc_trim(0): free pages of every arena,
// not only the top), so that the resident set holds what is in use. Results do not change; a
// later allocation faults its pages in again. A no-op without glibc.
void release_free_memory();

}  // namespace kvb::workers
