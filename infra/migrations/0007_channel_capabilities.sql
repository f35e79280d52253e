-- 0007: channel_capabilities, which signals each channel reports (herald/states.py CAPABILITIES).
--
-- Reports join it to show a signal the channel does not provide as unknown (NULL rate), never as
-- success or failure. tests/infra/test_analytics.py checks the rows equal herald.states; a
-- change there needs a new migration that inserts the new rows (latest insert wins, read FINAL).

CREATE TABLE IF NOT EXISTS {database}.channel_capabilities
(
    channel String
        COMMENT 'push | sms | email | inapp',
    delivered LowCardinality(String)
        COMMENT 'provided | partial | not_provided: delivered receipts',
    read LowCardinality(String)
        COMMENT 'provided | partial | not_provided: read signal',
    opened LowCardinality(String)
        COMMENT 'provided | partial | not_provided: open signal',
    clicked LowCardinality(String)
        COMMENT 'provided | partial | not_provided: click signal',
    observation_window_s Nullable(UInt32)
        COMMENT 'Seconds to wait for a delivered receipt before DELIVERY_UNKNOWN; NULL: none',
    updated_at DateTime64(3, 'UTC')
        COMMENT 'When this row was written (the ReplacingMergeTree version)'
)
ENGINE = ReplacingMergeTree(updated_at)
-- One row per channel.
ORDER BY channel
COMMENT 'Signals each channel provides (herald/states.py CAPABILITIES); read with FINAL';

INSERT INTO {database}.channel_capabilities
    (channel, delivered, read, opened, clicked, observation_window_s, updated_at)
VALUES
    ('push', 'not_provided', 'partial', 'not_provided', 'not_provided', NULL, '2026-01-01 00:00:00'),
    ('sms', 'provided', 'not_provided', 'not_provided', 'not_provided', 259200, '2026-01-01 00:00:00'),
    ('email', 'provided', 'not_provided', 'partial', 'provided', 259200, '2026-01-01 00:00:00'),
    ('inapp', 'provided', 'provided', 'not_provided', 'not_provided', 3600, '2026-01-01 00:00:00');
