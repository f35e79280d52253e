-- 0004: delivery_state, the current state of every delivery, that never goes backwards.
--
-- Fed by a materialized view over delivery_events (every job's events). Rows of one delivery are
-- combined with argMax over a version = state rank * 2^42 + occurred_at (ms). The ranks follow
-- the per-channel transition tables of herald/states.py: every allowed transition goes to an
-- equal or higher rank (equal only inside SENDING / RETRY_SCHEDULED / UNKNOWN, where the later
-- event wins); tests/infra/test_analytics.py checks that against herald.states.TABLES. So a late
-- `sent` (PROVIDER_ACCEPTED, rank 40) never replaces DELIVERED (60), whatever order rows arrive
-- in, and a replayed event (same row again) changes nothing: argMax and any are idempotent.
--
-- Read it through the view delivery_current (merges the aggregate states). Request-level events
-- (channel '') are not deliveries and are left out.

CREATE TABLE IF NOT EXISTS {database}.delivery_state
(
    tenant_id String
        COMMENT 'Tenant',
    notification_id String
        COMMENT 'Business notification',
    delivery_id String
        COMMENT 'One user x channel delivery',
    user_id SimpleAggregateFunction(any, String)
        COMMENT 'Recipient',
    channel SimpleAggregateFunction(any, String)
        COMMENT 'push | sms | email | inapp',
    notification_type SimpleAggregateFunction(any, String)
        COMMENT 'Catalog notification type',
    traffic_class SimpleAggregateFunction(any, String)
        COMMENT 'transactional | normal | bulk',
    provider SimpleAggregateFunction(anyLast, Nullable(String))
        COMMENT 'A provider involved (the last non-NULL one merged)',
    state AggregateFunction(argMax, String, UInt64)
        COMMENT 'Current state: the event with the highest version',
    reason AggregateFunction(argMax, String, UInt64)
        COMMENT 'status_reason of that event ('''' when none)',
    state_at AggregateFunction(argMax, DateTime64(3, 'UTC'), UInt64)
        COMMENT 'When the current state was entered',
    version SimpleAggregateFunction(max, UInt64)
        COMMENT 'State rank * 2^42 + occurred_at ms of the current state',
    first_at SimpleAggregateFunction(min, DateTime64(3, 'UTC'))
        COMMENT 'First event of the delivery',
    updated_at SimpleAggregateFunction(max, DateTime64(3, 'UTC'))
        COMMENT 'Latest event of the delivery (any state)'
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(first_at)
-- The same lookup order as delivery_events: tenant, notification, delivery.
ORDER BY (tenant_id, notification_id, delivery_id)
TTL toDateTime(first_at) + INTERVAL 30 DAY
COMMENT 'Current delivery state (never regresses); read through delivery_current';

CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.delivery_state_mv
TO {database}.delivery_state
AS SELECT
    tenant_id,
    notification_id,
    delivery_id,
    any(user_id) AS user_id,
    any(toString(channel)) AS channel,
    any(toString(notification_type)) AS notification_type,
    any(toString(traffic_class)) AS traffic_class,
    anyLast(toNullable(toString(provider))) AS provider,
    argMaxState(toString(state), v) AS state,
    argMaxState(coalesce(reason, ''), v) AS reason,
    argMaxState(occurred_at, v) AS state_at,
    max(v) AS version,
    min(occurred_at) AS first_at,
    max(occurred_at) AS updated_at
FROM
(
    SELECT
        *,
        toUInt64(transform(toString(state),
            ['ACCEPTED', 'PLANNED', 'SCHEDULED', 'QUEUED', 'SENDING', 'RETRY_SCHEDULED', 'UNKNOWN',
             'PROVIDER_ACCEPTED', 'DELIVERY_UNKNOWN', 'SUPPRESSED', 'EXPIRED', 'FAILED_PERMANENT',
             'DELIVERED', 'OPENED', 'READ', 'CLICKED'],
            [0, 10, 15, 20, 30, 30, 30, 40, 45, 50, 50, 50, 60, 70, 80, 80], 0)) * 4398046511104
            + toUInt64(toUnixTimestamp64Milli(occurred_at)) AS v
    FROM {database}.delivery_events
    WHERE channel != ''
)
GROUP BY tenant_id, notification_id, delivery_id;

CREATE VIEW IF NOT EXISTS {database}.delivery_current
AS SELECT
    tenant_id,
    notification_id,
    delivery_id,
    any(user_id) AS user_id,
    any(channel) AS channel,
    any(notification_type) AS notification_type,
    any(traffic_class) AS traffic_class,
    anyLast(provider) AS provider,
    argMaxMerge(state) AS state,
    nullIf(argMaxMerge(reason), '') AS reason,
    argMaxMerge(state_at) AS state_at,
    min(first_at) AS first_at,
    max(updated_at) AS updated_at
FROM {database}.delivery_state
GROUP BY tenant_id, notification_id, delivery_id;
