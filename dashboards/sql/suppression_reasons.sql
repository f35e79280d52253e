-- Suppressed deliveries by reason (opt_out_category, quiet_hours, frequency_cap, ...) over
-- [from, to).
SELECT
    if(reason = '', 'unspecified', reason) AS reason,
    uniqExactMerge(deliveries) AS suppressed
FROM funnel_minute
WHERE state = 'SUPPRESSED'
  AND minute >= {from:DateTime64(3)} AND minute < {to:DateTime64(3)}
  AND ({tenant:String} = '' OR tenant_id = {tenant:String})
GROUP BY reason
ORDER BY suppressed DESC, reason
