// The registry entries of every task, one function per task file in tasks/.
#pragma once

#include "tasks/task.h"

namespace kvb::tasks {
TaskInfo niah_task_info();
TaskInfo ruler_niah_single_task_info();
TaskInfo ruler_niah_multikey_task_info();
TaskInfo ruler_niah_multivalue_task_info();
TaskInfo ruler_niah_multiquery_task_info();
TaskInfo ruler_vt_task_info();
TaskInfo ruler_cwe_task_info();
TaskInfo ruler_fwe_task_info();
TaskInfo ruler_qa_task_info();
TaskInfo longbench_task_info();
TaskInfo longbench_v2_task_info();
TaskInfo xsum_task_info();
TaskInfo perplexity_task_info();
TaskInfo mc_task_info();
}  // namespace kvb::tasks
