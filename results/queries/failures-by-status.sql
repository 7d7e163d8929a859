-- failures-by-status: units that failed (error, oom, timeout, crashed) grouped by status: how many, their policies, distinct messages, the most common one
SELECT u.status,
       COUNT(*) AS units,
       (SELECT group_concat(p, ' ') FROM (SELECT DISTINCT p.policy AS p FROM units p
                                          WHERE p.status = u.status ORDER BY p.policy)) AS policies,
       COUNT(DISTINCT COALESCE(u.error, '')) AS messages,
       (SELECT COALESCE(e.error, '') FROM units e WHERE e.status = u.status
        GROUP BY e.error ORDER BY COUNT(*) DESC, e.error LIMIT 1) AS most_common_error
FROM units u
WHERE u.status IN ('error', 'oom', 'timeout', 'crashed')
GROUP BY u.status
ORDER BY units DESC, u.status;
