-- Deliveries per time bucket ({bucket_s:UInt32} seconds) that reached provider acceptance,
-- delivery, permanent failure, or an unknown outcome; empty buckets are filled with zeros.
SELECT
    toStartOfInterval(minute, toIntervalSecond({bucket_s:UInt32})) AS t,
    uniqExactMergeIf(deliveries, state = 'PROVIDER_ACCEPTED') AS provider_accepted,
    uniqExactMergeIf(deliveries, state = 'DELIVERED') AS delivered,
    uniqExactMergeIf(deliveries, state = 'FAILED_PERMANENT') AS failed,
    uniqExactMergeIf(deliveries, state IN ('UNKNOWN', 'DELIVERY_UNKNOWN')) AS unknown
FROM funnel_minute
WHERE channel != ''
  AND minute >= {from:DateTime64(3)} AND minute < {to:DateTime64(3)}
  AND ({tenant:String} = '' OR tenant_id = {tenant:String})
GROUP BY t
ORDER BY t WITH FILL
    FROM toStartOfInterval(toDateTime({from:DateTime64(3)}), toIntervalSecond({bucket_s:UInt32}))
    TO toDateTime({to:DateTime64(3)})
    STEP toIntervalSecond({bucket_s:UInt32})
