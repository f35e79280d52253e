-- 0009: DLQ replay generations (herald/dlq.py). A replayed delivery keeps its delivery_id and
-- numbers its attempts from 1 again; its events carry generation = the replays made so far
-- (schemas/delivery_event.avsc), and their event ids include it (herald.ids.event_id), so the
-- replay's rows sit next to the original attempts' rows instead of replacing them.
--
-- delivery_events gets the column (last, as in the Avro contract; rows written before it read
-- as generation 0). The current state then ranks by generation first: version = generation *
-- 2^49 + state rank * 2^42 + occurred_at (ms), so any event of a replay supersedes every state of
-- the generations before it (FAILED_PERMANENT included), and within one generation the rank
-- rules of 0004 are unchanged (tests/infra/test_analytics.py checks the ranks against
-- herald.states.TABLES). Rank < 2^7 and occurred_at ms < 2^42 keep the parts apart; UInt64
-- leaves room for 2^15 generations. Generation 0's version is exactly 0004's, so rows that view
-- already wrote stay comparable.
--
-- The view is replaced without a gap: the new one is created before 0004's is dropped. While
-- both exist an insert reaches delivery_state twice, which its aggregates absorb (argMax, max,
-- min, any over the same rows).

ALTER TABLE {database}.delivery_events
    ADD COLUMN IF NOT EXISTS generation UInt16 DEFAULT 0
        COMMENT 'DLQ replay generation of the delivery (0 before any replay); a higher one supersedes the state of lower ones';

ALTER TABLE {database}.delivery_state
    COMMENT COLUMN IF EXISTS version
        'Generation * 2^49 + state rank * 2^42 + occurred_at ms of the current state';

CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.delivery_state_generation_mv
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
        toUInt64(generation) * 562949953421312
            + toUInt64(transform(toString(state),
            ['ACCEPTED', 'PLANNED', 'SCHEDULED', 'QUEUED', 'SENDING', 'RETRY_SCHEDULED', 'UNKNOWN',
             'PROVIDER_ACCEPTED', 'DELIVERY_UNKNOWN', 'SUPPRESSED', 'EXPIRED', 'FAILED_PERMANENT',
             'DELIVERED', 'OPENED', 'READ', 'CLICKED'],
            [0, 10, 15, 20, 30, 30, 30, 40, 45, 50, 50, 50, 60, 70, 80, 80], 0)) * 4398046511104
            + toUInt64(toUnixTimestamp64Milli(occurred_at)) AS v
    FROM {database}.delivery_events
    WHERE channel != ''
)
GROUP BY tenant_id, notification_id, delivery_id;

DROP VIEW IF EXISTS {database}.delivery_state_mv;
