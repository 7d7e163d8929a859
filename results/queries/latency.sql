-- latency: prefill ms (units that prefilled their whole prompt; '-' where every unit started from an earlier prompt's prefix), decode ms/token (p50, p99 over units of their per-step medians and p99s), tokens/s, policy overhead, shares of units whose prefill was shared and that reused a prefix; units that decoded in batches of different sizes are separate rows (decode batch: sequences per step, 1 = alone; only equal batch sizes compare)
SELECT u.model, u.task, u.policy, CASE u.kv_budget_spec WHEN '' THEN '-' ELSE u.kv_budget_spec END AS kv_budget,
       COALESCE(u.context_length, '-') AS context_length,
       printf('%.0f', ROUND(x.decode_batch)) AS "decode batch", COUNT(*) AS n,
       CASE WHEN SUM(x.prefill_reused = 0) = 0 THEN '-'
            ELSE printf('%.1f', AVG(CASE WHEN x.prefill_reused = 0 THEN x.prefill_ms END)) END AS "prefill ms",
       printf('%.2f', AVG(x.decode_ms_p50)) AS "decode ms/tok p50",
       printf('%.2f', MAX(x.decode_ms_p99)) AS "decode ms/tok p99",
       printf('%.1f', AVG(x.tokens_per_s)) AS "tok/s",
       printf('%.2f', AVG(x.policy_ms)) AS "policy ms",
       printf('%.2f', AVG(x.prefill_shared)) AS "prefill shared",
       printf('%.2f', AVG(x.prefill_reused > 0)) AS "prefix reused"
FROM units u JOIN measurements x ON x.unit_key = u.unit_key
WHERE u.status = 'ok'
GROUP BY u.model, u.task, u.policy, u.kv_budget_spec, u.context_length, ROUND(x.decode_batch)
ORDER BY u.model, u.task, u.policy <> 'full', u.policy, CAST(u.kv_budget_spec AS INTEGER), u.context_length,
         ROUND(x.decode_batch);
