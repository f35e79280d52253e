-- Deliveries first seen in [from, to) by channel and current state (delivery_current: the
-- highest-ranked state per delivery, so out-of-order events never make it go backwards).
SELECT
    channel,
    state,
    count() AS deliveries
FROM delivery_current
WHERE first_at >= {from:DateTime64(3)} AND first_at < {to:DateTime64(3)}
  AND ({tenant:String} = '' OR tenant_id = {tenant:String})
GROUP BY channel, state
ORDER BY channel, deliveries DESC
