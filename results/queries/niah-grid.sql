-- niah-grid: NIAH recall per policy and budget over context length x depth (mean over samples)
SELECT u.model, u.policy, CASE u.kv_budget_spec WHEN '' THEN '-' ELSE u.kv_budget_spec END AS kv_budget,
       u.context_length, CAST(u.depth AS INTEGER) AS depth, COUNT(*) AS n,
       printf('%.4f', AVG(m.value)) AS recall
FROM units u JOIN metrics m ON m.unit_key = u.unit_key AND m.name = 'recall'
WHERE u.task = 'niah' AND u.status = 'ok'
GROUP BY u.model, u.policy, u.kv_budget_spec, u.context_length, u.depth
ORDER BY u.model, u.policy <> 'full', u.policy, CAST(u.kv_budget_spec AS INTEGER), u.context_length, u.depth;
