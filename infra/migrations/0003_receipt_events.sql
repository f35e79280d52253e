-- 0003: receipt_events, every normalized provider receipt and what folding it did.
--
-- Written by the receipts job (dataflows/receipts.py, herald/delivery_fold.fact_row). One row per
-- provider event: the provider's own event id where it gives one (SendGrid sg_event_id, Twilio's
-- webhook idempotency token), else sha256 of the normalized fields, so the same webhook received
-- three times is one row. Unmappable events (a status Herald has no state for) and unmatched
-- ones (no delivery claimed them within the hold TTL) are kept here and counted, never guessed.
--
-- Idempotency: ReplacingMergeTree keyed by (provider, provider_event_id) with `version` = how
-- informative the outcome is (applied 5 > premature 4 > stale 3 > duplicate 2 > unmappable 1 >
-- unmatched 0), so a receipt first held as unmatched and later re-driven and applied ends
-- `applied`. Readers use FINAL or uniqExact(provider_event_id).

CREATE TABLE IF NOT EXISTS {database}.receipt_events
(
    provider_event_id String
        COMMENT 'Provider event id (sendgrid:<sg_event_id>, twilio:<token>) or sha256:<normalized fields>',
    provider LowCardinality(String)
        COMMENT 'sms_a | sms_b | email | inbox | app',
    receipt_id String
        COMMENT 'raw_receipt.receipt_id: reference to the raw payload (herald.receipts.raw)',
    provider_msg_id Nullable(String)
        COMMENT 'Provider message id the receipt is about (SMS sid, X-Message-Id); NULL for Herald events',
    delivery_id String
        COMMENT 'Delivery it was joined to; empty when unmatched',
    notification_id String
        COMMENT 'Notification of that delivery; empty when unmatched',
    tenant_id String
        COMMENT 'Tenant of that delivery; empty when unmatched',
    channel LowCardinality(String)
        COMMENT 'push | sms | email | inapp',
    status LowCardinality(String)
        COMMENT 'The provider''s own status word (delivered, undelivered, bounce, open, ...)',
    state LowCardinality(String)
        COMMENT 'Herald state it reports (DELIVERED, FAILED_PERMANENT, ...); empty when unmappable',
    reason Nullable(String)
        COMMENT 'Machine-readable reason (twilio_30003, vonage_err_3, bounce, ...)',
    outcome LowCardinality(String)
        COMMENT 'What folding it did: applied | duplicate | stale | premature | unmappable | unmatched',
    occurred_at DateTime64(3, 'UTC')
        COMMENT 'Provider time of the event (receive time when the provider gives none)',
    received_at DateTime64(3, 'UTC')
        COMMENT 'When Herald received the webhook; partition and TTL key',
    recorded_at DateTime64(3, 'UTC')
        COMMENT 'When the receipts job folded it',
    attributes Map(String, String)
        COMMENT 'Error codes, raw_ref (topic/partition/offset), unknown fields as x.<name>; no personal data',
    version UInt8
        COMMENT 'Outcome rank, the ReplacingMergeTree version (most informative outcome wins)'
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(received_at)
-- provider first (per-provider error rates read one range), provider_event_id last: the dedup key.
ORDER BY (provider, provider_event_id)
TTL toDateTime(received_at) + INTERVAL 30 DAY
SETTINGS ttl_only_drop_parts = 1
COMMENT 'Normalized provider receipts and their fold outcome (herald/delivery_fold.py)';
