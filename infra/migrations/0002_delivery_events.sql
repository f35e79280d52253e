-- 0002: delivery_events, the append-only log of delivery state transitions.
--
-- Columns are exactly the Avro contract schemas/delivery_event.avsc (same names), loaded by
-- sinks/clickhouse.py from herald.delivery-events.
--
-- Idempotency: every Bytewax output is at-least-once, so the same event may be inserted more than
-- once (replays, retried batches, a job resumed from its last snapshot). event_id is the last
-- column of the sorting key of a ReplacingMergeTree, so copies of one event collapse into one row
-- when parts merge; until then readers deduplicate with FINAL (or uniqExact(event_id) /
-- argMax(..., recorded_at) per event). Copies of one event share occurred_at, hence the same
-- daily partition, which is where ReplacingMergeTree deduplicates.
--
-- Later migrations (0003+) add the analytic materialized views (current delivery state, funnels,
-- latency). A materialized view sees every insert, duplicates included, so their targets must be
-- duplicate-tolerant: ReplacingMergeTree keyed by delivery_id/event_id, or AggregatingMergeTree
-- with uniqExactState(event_id)-style states, never plain counts.

CREATE TABLE IF NOT EXISTS {database}.delivery_events
(
    event_id String
        COMMENT 'Unique event id (deterministic uuid5, herald.ids); the idempotency key',
    delivery_id String
        COMMENT 'One user x channel delivery, stable across retries, DLQ replay and failover; the notification_id for request-level events',
    notification_id String
        COMMENT 'The business notification (one API request or campaign)',
    user_id String
        COMMENT 'Recipient; empty for request-level events with a segment audience',
    tenant_id String
        COMMENT 'Tenant that sent the notification',
    notification_type LowCardinality(String)
        COMMENT 'Catalog notification type (otp, order_shipped, post_liked, ...)',
    channel LowCardinality(String)
        COMMENT 'push | sms | email | inapp; empty for request-level events',
    traffic_class LowCardinality(String)
        COMMENT 'transactional | normal | bulk',
    state LowCardinality(String)
        COMMENT 'State entered: ACCEPTED, PLANNED, ..., DELIVERED, READ, FAILED_PERMANENT, UNKNOWN, ...',
    reason Nullable(String)
        COMMENT 'Machine-readable status_reason (opt_out_category, quiet_hours, http_429, ...); NULL when none',
    provider LowCardinality(Nullable(String))
        COMMENT 'Provider involved (apns, fcm, sms_a, ...); NULL before dispatch',
    provider_msg_id Nullable(String)
        COMMENT 'Provider message id (apns-id, FCM name, SMS sid); NULL when unknown',
    attempt UInt16
        COMMENT 'Attempt number the event belongs to; 0 before the first provider call',
    latency_ms Nullable(Int64)
        COMMENT 'Milliseconds from accepted_at to this event where meaningful; NULL otherwise',
    occurred_at DateTime64(3, 'UTC')
        COMMENT 'When the transition happened (provider time for receipts); partition and TTL key',
    recorded_at DateTime64(3, 'UTC')
        COMMENT 'When Herald recorded the event; the ReplacingMergeTree version (latest copy wins)',
    attributes Map(String, String)
        COMMENT 'Extra facts (http status, error code, raw receipt id); never message bodies',
    INDEX occurred_at_minmax occurred_at TYPE minmax GRANULARITY 1
)
ENGINE = ReplacingMergeTree(recorded_at)
-- Daily partitions: time-range analytics prune whole days (and, through the partition's min/max
-- of occurred_at plus the minmax index above, granules within a day); TTL drops whole parts.
PARTITION BY toDate(occurred_at)
-- Sorting key, most selective lookup first:
--   tenant_id        every API read is scoped by the caller's tenant (few distinct values);
--   notification_id  GET /v1/notifications/{id} and per-campaign funnels read one contiguous range;
--   delivery_id      the events of one user x channel delivery sit together (state folding);
--   event_id         last, so it is the deduplication key: copies of one event collapse.
ORDER BY (tenant_id, notification_id, delivery_id, event_id)
-- Delivery history is kept 30 days after the transition happened.
TTL toDateTime(occurred_at) + INTERVAL 30 DAY
SETTINGS ttl_only_drop_parts = 1
COMMENT 'Append-only delivery state events (schemas/delivery_event.avsc), deduplicated by event_id';
