-- 0010: segments, the registry of audience snapshots made through the API (api/segments.py).
--
-- A segment's members stay in segment_members (0008), which the plan job reads; this table says
-- which tenant owns a segment_id, how many distinct users it holds and whether it may be
-- targeted. Segment ids are one namespace for every tenant (segment_members has no tenant), so an
-- id registered here belongs to its tenant for good, deleted or not.
--
-- An upload writes a row with deleted = 1 before its first member row and the row with
-- deleted = 0 (and the size) after its last: a segment is visible only once complete, and an
-- upload that died half-way leaves a registered, unusable id instead of rows that look like a
-- hand-written segment. Segments without a row here (written by dataflows/_audience.load_segment)
-- are still accepted as campaign audiences. Each change is a new row with a higher version;
-- readers use FINAL.
CREATE TABLE IF NOT EXISTS {database}.segments
(
    tenant_id String
        COMMENT 'Tenant that created the segment (api/auth.py Tenant.tenant_id)',
    segment_id String
        COMMENT 'Id of the snapshot in segment_members; unique across tenants',
    size UInt64
        COMMENT 'Distinct users in the snapshot (0 until the upload is complete)',
    source LowCardinality(String)
        COMMENT 'upload (PUT /v1/segments/{id}) | query (POST /v1/segments)',
    created_at DateTime64(3, 'UTC')
        COMMENT 'When the upload or query started',
    deleted UInt8
        COMMENT '1: not targetable (upload in progress or failed, or DELETE /v1/segments/{id})',
    version UInt64
        COMMENT 'Microseconds since the epoch of the change, above every earlier version'
)
ENGINE = ReplacingMergeTree(version)
-- One row per tenant and segment (the latest version); a tenant's segments are one range, listed
-- in segment_id order (keyset cursor).
ORDER BY (tenant_id, segment_id)
COMMENT 'Audience snapshots registered through the API; members in segment_members; read FINAL';
