-- 0011: trace context. A notification accepted with a W3C `traceparent` (an API header or a
-- Kafka header of the request) carries it on every record made from it
-- (schemas/delivery_event.avsc), so its rows can be found by trace id:
-- WHERE substring(traceparent, 4, 32) = '<trace id>'. Last column, as in the Avro contract; rows
-- written before it read as NULL.

ALTER TABLE {database}.delivery_events
    ADD COLUMN IF NOT EXISTS traceparent Nullable(String)
        COMMENT 'W3C traceparent the notification was accepted with (NULL: none given)';
