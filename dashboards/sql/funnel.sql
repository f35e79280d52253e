-- Deliveries that entered each funnel state over [from, to) (request-level ACCEPTED counts
-- notifications). Replay-safe: merges uniqExact states. `opened` is any engagement (an email
-- opened or clicked, an in-app item or a push read); `read` the in-app and push reads alone.
SELECT
    step,
    uniqExactMergeIf(deliveries, state IN states) AS count
FROM funnel_minute
ARRAY JOIN
    ['accepted', 'planned', 'suppressed', 'provider_accepted', 'delivered', 'opened', 'read',
     'clicked', 'failed', 'unknown', 'expired'] AS step,
    [['ACCEPTED'], ['PLANNED'], ['SUPPRESSED'],
     ['PROVIDER_ACCEPTED', 'DELIVERED', 'DELIVERY_UNKNOWN', 'READ', 'OPENED', 'CLICKED'],
     ['DELIVERED', 'READ', 'OPENED', 'CLICKED'], ['READ', 'OPENED', 'CLICKED'], ['READ'],
     ['CLICKED'], ['FAILED_PERMANENT'], ['UNKNOWN', 'DELIVERY_UNKNOWN'], ['EXPIRED']] AS states
WHERE minute >= {from:DateTime64(3)} AND minute < {to:DateTime64(3)}
  AND ({tenant:String} = '' OR tenant_id = {tenant:String})
  AND (channel != '' OR step = 'accepted')
GROUP BY step
ORDER BY indexOf(['accepted', 'planned', 'suppressed', 'provider_accepted', 'delivered',
                  'opened', 'read', 'clicked', 'failed', 'unknown', 'expired'], step)
