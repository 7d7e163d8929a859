-- summary: mean score per model x task x policy x budget x metric with its 95% interval (Wilson for 0/1 scores, else a percentile bootstrap), n, and unit status counts
WITH scores AS (
  SELECT u.model, u.task, u.policy, u.kv_budget_spec AS kv_budget, m.name AS metric,
         m.higher_is_better AS hib, m.value
  FROM units u JOIN metrics m ON m.unit_key = u.unit_key
  WHERE u.status = 'ok' AND m.value IS NOT NULL
),
agg AS (
  SELECT model, task, policy, kv_budget, metric, MAX(hib) AS hib, COUNT(*) AS n, AVG(value) AS mean,
         -- ci95_lo / ci95_hi are registered by kvbench (results/store.cc): results/stats.h
         -- score_ci, the interval every table and plot shows (Wilson for 0/1 scores, else the
         -- percentile bootstrap of the mean), inside the metric's range
         ci95_lo(value) AS lo, ci95_hi(value) AS hi
  FROM scores GROUP BY model, task, policy, kv_budget, metric
),
status AS (
  SELECT model, task, policy, kv_budget_spec AS kv_budget,
         SUM(status = 'ok') AS ok, SUM(status = 'error') AS error,
         SUM(status IN ('timeout', 'oom', 'crashed')) AS failed,
         SUM(status IN ('pending', 'running')) AS unfinished
  FROM units GROUP BY model, task, policy, kv_budget_spec
)
SELECT a.model, a.task, a.policy, CASE a.kv_budget WHEN '' THEN '-' ELSE a.kv_budget END AS kv_budget,
       a.metric || CASE a.hib WHEN 1 THEN ' ↑' ELSE ' ↓' END AS metric,
       printf('%.4f', a.mean) AS mean, printf('%.4f', a.lo) AS "ci95 lo",
       printf('%.4f', a.hi) AS "ci95 hi", a.n,
       s.ok, s.error, s.failed, s.unfinished
FROM agg a JOIN status s USING (model, task, policy, kv_budget)
ORDER BY a.model, a.task, a.metric, a.policy <> 'full', a.policy, CAST(a.kv_budget AS INTEGER);
