-- 0005: funnel_minute, deliveries reaching each state per minute, tenant, type, channel,
-- provider and class (accepted, suppressed by reason, planned, provider-accepted, delivered,
-- opened, clicked, failed, unknown, expired: one `state` value each).
--
-- Replays never double-count: the view stores uniqExactState(delivery_id) and
-- uniqExactState(event_id), never counts. A replayed or re-inserted event adds an element
-- already in the set, so uniqExactMerge gives the same number however often a range is loaded
-- (tests/infra/test_analytics.py replays a range twice and compares every count).
-- `deliveries` answers "how many deliveries reached this state", `events` "how many events"
-- (e.g. retries per provider). Request-level ACCEPTED rows (channel '') count notifications.
--
-- Backfill after creating the view on existing data: `herald replay --topic
-- herald.delivery-events --from ... --to ...` (idempotent, see herald/replay.py).

CREATE TABLE IF NOT EXISTS {database}.funnel_minute
(
    minute DateTime('UTC')
        COMMENT 'Minute the state was entered (occurred_at, truncated)',
    tenant_id String
        COMMENT 'Tenant',
    notification_type LowCardinality(String)
        COMMENT 'Catalog notification type',
    channel LowCardinality(String)
        COMMENT 'push | sms | email | inapp; empty for request-level ACCEPTED',
    provider LowCardinality(String)
        COMMENT 'Provider; empty before dispatch',
    traffic_class LowCardinality(String)
        COMMENT 'transactional | normal | bulk',
    state LowCardinality(String)
        COMMENT 'State entered',
    reason String
        COMMENT 'status_reason (suppression reason, error code); empty when none',
    deliveries AggregateFunction(uniqExact, String)
        COMMENT 'Distinct delivery_ids that entered the state (uniqExactMerge)',
    events AggregateFunction(uniqExact, String)
        COMMENT 'Distinct event_ids (uniqExactMerge)'
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
-- Tenant first (every report is per tenant), then time range, then the breakdowns.
ORDER BY (tenant_id, minute, notification_type, channel, provider, traffic_class, state, reason)
TTL minute + INTERVAL 30 DAY
COMMENT 'Delivery funnel per minute, replay-safe (uniqExact states); read with uniqExactMerge';

CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.funnel_minute_mv
TO {database}.funnel_minute
AS SELECT
    toStartOfMinute(occurred_at) AS minute,
    tenant_id,
    notification_type,
    channel,
    coalesce(provider, '') AS provider,
    traffic_class,
    state,
    coalesce(reason, '') AS reason,
    uniqExactState(delivery_id) AS deliveries,
    uniqExactState(event_id) AS events
FROM {database}.delivery_events
GROUP BY minute, tenant_id, notification_type, channel, provider, traffic_class, state, reason;
