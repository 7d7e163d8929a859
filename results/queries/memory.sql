-- memory: KV bytes (logical, physical) and occupancy by policy, budget and context length (means over ok units)
SELECT u.model, u.task, u.policy, CASE u.kv_budget_spec WHEN '' THEN '-' ELSE u.kv_budget_spec END AS kv_budget,
       COALESCE(u.context_length, '-') AS context_length, COUNT(*) AS n,
       printf('%.3f', AVG(x.kv_bytes_final) / 1048576.0) AS "KV MiB final",
       printf('%.3f', AVG(x.kv_bytes_peak) / 1048576.0) AS "KV MiB peak",
       printf('%.3f', AVG(x.kv_physical_peak) / 1048576.0) AS "physical MiB peak",
       printf('%.1f', AVG(x.policy_state_bytes) / 1024.0) AS "policy state KiB",
       printf('%.1f', AVG(x.occupancy_mean)) AS "occupancy mean",
       MAX(x.occupancy_peak) AS "occupancy peak"
FROM units u JOIN measurements x ON x.unit_key = u.unit_key
WHERE u.status = 'ok'
GROUP BY u.model, u.task, u.policy, u.kv_budget_spec, u.context_length
ORDER BY u.model, u.task, u.policy <> 'full', u.policy, CAST(u.kv_budget_spec AS INTEGER), u.context_length;
