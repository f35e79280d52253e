-- Per provider over [from, to): provider calls accepted, permanent failures, unknown outcomes,
-- retries scheduled (events: one per attempt), and the error rate
-- (failed + unknown + retries) / (accepted + failed + unknown + retries).
SELECT
    provider,
    uniqExactMergeIf(events, state = 'PROVIDER_ACCEPTED') AS accepted,
    uniqExactMergeIf(events, state = 'FAILED_PERMANENT') AS failed,
    uniqExactMergeIf(events, state IN ('UNKNOWN', 'DELIVERY_UNKNOWN')) AS unknown,
    uniqExactMergeIf(events, state = 'RETRY_SCHEDULED') AS retried,
    uniqExactMergeIf(events, state = 'DELIVERED') AS delivered,
    if(accepted + failed + unknown + retried = 0, NULL,
       (failed + unknown + retried) / (accepted + failed + unknown + retried)) AS error_rate
FROM funnel_minute
WHERE provider != ''
  AND minute >= {from:DateTime64(3)} AND minute < {to:DateTime64(3)}
  AND ({tenant:String} = '' OR tenant_id = {tenant:String})
GROUP BY provider
ORDER BY provider
