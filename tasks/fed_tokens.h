// The tokens of a sample that reach the model, for budgets given as a fraction of the prompt.
#pragma once

#include "tasks/task.h"

namespace kvb::tasks {

// Of `counted` tokens of a sample's text (context + question + text), those the model is fed: a
// perplexity sample scores at most its max_tokens, and a prompt longer than `max_prompt_tokens`
// (the run's, when > 0, and the sample's own) is middle-truncated to it. A budget given as a
// fraction of the prompt ({ratio: r}, {compression_ratio: c}) is a fraction of these.
inline int fed_prompt_tokens(const Sample& s, int counted, int run_max_prompt_tokens) {
  int n = counted;
  if (s.kind == SampleKind::kPerplexity && s.max_tokens > 0 && s.max_tokens < n) n = s.max_tokens;
  if (run_max_prompt_tokens > 0 && run_max_prompt_tokens < n) n = run_max_prompt_tokens;
  if (s.max_prompt_tokens > 0 && s.max_prompt_tokens < n) n = s.max_prompt_tokens;
  return n;
}

}  // namespace kvb::tasks
