-- 0006: latency_samples, one row per latency-bearing event, deduplicated by event_id.
--
-- Stages: accept_to_provider = latency_ms of PROVIDER_ACCEPTED (accepted_at -> provider said
-- yes); provider_to_delivered = attributes['provider_latency_ms'] of DELIVERED (written by the
-- receipts job: provider acceptance -> delivered receipt).
--
-- Quantile states cannot be made duplicate-proof, so this view keeps samples instead: a
-- ReplacingMergeTree whose sorting key ends with event_id, read with FINAL, so a replayed event
-- is one sample. Quantiles are computed at query time (dashboards/sql/latency_*.sql).

CREATE TABLE IF NOT EXISTS {database}.latency_samples
(
    minute DateTime('UTC')
        COMMENT 'Minute of the event (occurred_at, truncated)',
    tenant_id String
        COMMENT 'Tenant',
    stage LowCardinality(String)
        COMMENT 'accept_to_provider | provider_to_delivered',
    traffic_class LowCardinality(String)
        COMMENT 'transactional | normal | bulk',
    channel LowCardinality(String)
        COMMENT 'push | sms | email | inapp',
    provider LowCardinality(String)
        COMMENT 'Provider',
    notification_type LowCardinality(String)
        COMMENT 'Catalog notification type',
    event_id String
        COMMENT 'The event the sample comes from; the dedup key',
    latency_ms Int64
        COMMENT 'Milliseconds of the stage'
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(minute)
-- Tenant and stage first (each panel reads one stage), then time; event_id last: the dedup key.
ORDER BY (tenant_id, stage, minute, traffic_class, channel, provider, notification_type, event_id)
TTL minute + INTERVAL 30 DAY
COMMENT 'Latency samples per stage (dedup by event_id; read with FINAL)';

CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.latency_samples_mv
TO {database}.latency_samples
AS SELECT
    toStartOfMinute(occurred_at) AS minute,
    tenant_id,
    tupleElement(lat, 1) AS stage,
    traffic_class,
    channel,
    coalesce(provider, '') AS provider,
    notification_type,
    event_id,
    assumeNotNull(tupleElement(lat, 2)) AS latency_ms
FROM
(
    SELECT
        occurred_at, tenant_id, traffic_class, channel, provider, notification_type, event_id,
        arrayFilter(s -> isNotNull(tupleElement(s, 2)), [
            tuple('accept_to_provider', if(state = 'PROVIDER_ACCEPTED', latency_ms, NULL)),
            tuple('provider_to_delivered',
                  if(state = 'DELIVERED', toInt64OrNull(attributes['provider_latency_ms']), NULL))
        ]) AS samples
    FROM {database}.delivery_events
    WHERE state IN ('PROVIDER_ACCEPTED', 'DELIVERED')
)
ARRAY JOIN samples AS lat;
