-- failures: every unit that did not finish ok (superseded ones aside: their data changed), with its status, attempts and error
SELECT u.model, u.task, u.sample_id, u.policy, CASE u.kv_budget_spec WHEN '' THEN '-' ELSE u.kv_budget_spec END AS kv_budget,
       u.status, u.attempts, u.crash_count, COALESCE(u.error, '') AS error
FROM units u
WHERE u.status NOT IN ('ok', 'superseded')
ORDER BY u.status, u.model, u.task, u.sample_id, u.policy;
