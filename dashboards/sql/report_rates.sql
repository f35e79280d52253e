-- The seed's reporting questions, per channel, over [from, to):
--   acceptance_rate          the platform accepted the delivery for sending:
--                            (deliveries - suppressed - expired) / deliveries
--   provider_accept_rate     a provider accepted it: provider-accepted-or-later / accepted_for_send
--   observable_delivery_rate delivered-or-later / provider-accepted, where the channel reports
--                            delivery (push: APNs/FCM send no delivered receipt -> unknown)
--   open_rate                read/opened/clicked / delivered (provider-accepted where delivery is
--                            not reported), where the channel reports opens or reads at all
-- A rate the channel cannot observe is NULL, and its *_shown column says 'unknown': never
-- counted as success or failure. `partial` signals (email opens blocked by image proxies, push
-- opens reported by the app) are shown with their coverage.
-- DELIVERY_UNKNOWN (no receipt within the observation window) is counted apart, not as failed.
WITH
    caps AS (SELECT channel, delivered, read, opened FROM channel_capabilities FINAL),
    counts AS (
        SELECT
            channel,
            uniqExactMerge(deliveries) AS n_deliveries,
            uniqExactMergeIf(deliveries, state = 'SUPPRESSED') AS suppressed,
            uniqExactMergeIf(deliveries, state = 'EXPIRED') AS expired,
            uniqExactMergeIf(deliveries, state IN ('PROVIDER_ACCEPTED', 'DELIVERED',
                'DELIVERY_UNKNOWN', 'READ', 'OPENED', 'CLICKED')) AS provider_accepted,
            uniqExactMergeIf(deliveries, state IN ('DELIVERED', 'READ', 'OPENED', 'CLICKED'))
                AS delivered,
            uniqExactMergeIf(deliveries, state = 'DELIVERY_UNKNOWN') AS delivery_unknown,
            uniqExactMergeIf(deliveries, state = 'FAILED_PERMANENT') AS failed,
            uniqExactMergeIf(deliveries, state IN ('READ', 'OPENED', 'CLICKED')) AS opened
        FROM funnel_minute
        WHERE channel != ''
          AND minute >= {from:DateTime64(3)} AND minute < {to:DateTime64(3)}
          AND ({tenant:String} = '' OR tenant_id = {tenant:String})
        GROUP BY channel
    )
SELECT
    c.channel AS channel,
    c.n_deliveries AS deliveries,
    c.suppressed AS suppressed,
    c.expired AS expired,
    greatest(c.n_deliveries - c.suppressed - c.expired, 0) AS accepted_for_send,
    c.provider_accepted AS provider_accepted,
    c.delivered AS delivered,
    c.delivery_unknown AS delivery_unknown,
    c.failed AS failed,
    c.opened AS opened,
    if(c.n_deliveries = 0, NULL, accepted_for_send / c.n_deliveries) AS acceptance_rate,
    if(accepted_for_send = 0, NULL, c.provider_accepted / accepted_for_send)
        AS provider_accept_rate,
    if(caps.delivered = 'not_provided' OR c.provider_accepted = 0, NULL,
       c.delivered / c.provider_accepted) AS observable_delivery_rate,
    multiIf(caps.read = 'not_provided' AND caps.opened = 'not_provided', NULL,
            caps.delivered = 'not_provided',
            if(c.provider_accepted = 0, NULL, c.opened / c.provider_accepted),
            if(c.delivered = 0, NULL, c.opened / c.delivered)) AS open_rate,
    if(caps.delivered = 'not_provided', 'unknown',
       if(observable_delivery_rate IS NULL, '-', printf('%.1f%%', observable_delivery_rate * 100))) AS observable_delivery_rate_shown,
    multiIf(caps.read = 'not_provided' AND caps.opened = 'not_provided', 'unknown',
            open_rate IS NULL, '-',
            printf('%.1f%%', open_rate * 100)
            || if(caps.read = 'partial' OR caps.opened = 'partial', ' (partial)', ''))
        AS open_rate_shown,
    caps.delivered AS delivered_signal,
    if(caps.read = 'not_provided', caps.opened, caps.read) AS open_signal
FROM counts AS c
LEFT JOIN caps ON caps.channel = c.channel
ORDER BY channel
