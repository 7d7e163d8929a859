// The task registry: an explicit table in the order `kvbench ls tasks` prints.
#include "tasks/tasks.h"

namespace kvb::tasks {
const std::vector<TaskInfo>& task_registry() {
  static const std::vector<TaskInfo> table = {
      niah_task_info(), ruler_niah_single_task_info(), ruler_niah_multikey_task_info(),
      ruler_niah_multivalue_task_info(), ruler_niah_multiquery_task_info(), ruler_vt_task_info(),
      ruler_cwe_task_info(), ruler_fwe_task_info(), ruler_qa_task_info(),
      longbench_task_info(), longbench_v2_task_info(), xsum_task_info(), perplexity_task_info(),
      mc_task_info(),
  };
  return table;
}
}  // namespace kvb::tasks
