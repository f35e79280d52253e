-- 0008: segment_members, audience snapshots expanded by the plan job.
--
-- A segment_id names an immutable audience snapshot (new membership = a new segment_id). The
-- plan job reads it in 1,000-user keyset pages ordered by user_id and records the last user_id
-- of each finished page in its recovery snapshot, so a crashed fan-out of a 50M audience
-- resumes at the next unfinished page instead of starting over (dataflows/_audience.py).
CREATE TABLE IF NOT EXISTS {database}.segment_members
(
    segment_id String
        COMMENT 'Immutable audience snapshot; new membership is a new segment_id',
    user_id String
        COMMENT 'Member; pages are read in user_id order (keyset cursor)',
    params Map(String, String)
        COMMENT 'Per-user template params (e.g. first_name); usually empty'
)
ENGINE = ReplacingMergeTree
-- One contiguous range per segment; a re-loaded member collapses into one row on merge, and
-- readers take one row per user_id (LIMIT 1 BY) until then.
ORDER BY (segment_id, user_id)
COMMENT 'Audience snapshots expanded by the plan job in 1,000-user batches';
