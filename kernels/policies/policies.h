// The registry entries of every policy, one function per file in kernels/policies/.
#pragma once

#include "kernels/policies/policy.h"

namespace kvb::policies {
PolicyInfo full_policy_info();
PolicyInfo window_policy_info();
PolicyInfo h2o_policy_info();
PolicyInfo streaming_llm_policy_info();
PolicyInfo scissorhands_policy_info();
PolicyInfo snapkv_policy_info();
PolicyInfo pyramidkv_policy_info();
PolicyInfo ada_snapkv_policy_info();
PolicyInfo ada_pyramidkv_policy_info();
PolicyInfo subgen_policy_info();
PolicyInfo subgen_kcenter_policy_info();
PolicyInfo tova_policy_info();
PolicyInfo knorm_policy_info();
PolicyInfo random_policy_info();
PolicyInfo keydiff_policy_info();             // kvpress's presses
PolicyInfo observed_attention_policy_info();
PolicyInfo cur_policy_info();
PolicyInfo lagkv_policy_info();
PolicyInfo expected_attention_policy_info();
PolicyInfo noncausal_attn_policy_info();
PolicyInfo leverage_policy_info();
PolicyInfo compactor_policy_info();
PolicyInfo qfilter_policy_info();
PolicyInfo finch_policy_info();
PolicyInfo kvzip_policy_info();
PolicyInfo think_policy_info();
PolicyInfo simlayerkv_policy_info();
PolicyInfo duo_attention_policy_info();
PolicyInfo python_policy_info();  // python_policy.cc: a policy in one Python file
}  // namespace kvb::policies
