-- p50/p95/p99 latency (ms) per stage and traffic class over [from, to).
-- accept_to_provider: accepted_at -> provider accepted (the OTP SLO is p99 < 2 s here);
-- provider_to_delivered: provider accepted -> delivered receipt. One sample per event (FINAL).
SELECT
    stage,
    traffic_class,
    count() AS samples,
    round(quantileExact(0.5)(latency_ms)) AS p50_ms,
    round(quantileExact(0.95)(latency_ms)) AS p95_ms,
    round(quantileExact(0.99)(latency_ms)) AS p99_ms
FROM latency_samples FINAL
WHERE minute >= {from:DateTime64(3)} AND minute < {to:DateTime64(3)}
  AND ({tenant:String} = '' OR tenant_id = {tenant:String})
GROUP BY stage, traffic_class
ORDER BY stage, indexOf(['transactional', 'normal', 'bulk'], traffic_class)
