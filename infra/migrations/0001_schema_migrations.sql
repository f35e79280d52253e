-- 0001: the Herald database and the bookkeeping table of infra/migrate.py.
--
-- Conventions for every migration file (checked by tests/infra/test_migrate.py):
--   * named NNNN_name.sql, applied in number order, never edited once applied (the checksum of
--     each applied file is recorded below and a changed file is refused);
--   * idempotent: CREATE ... IF NOT EXISTS, ALTER ... ADD COLUMN IF NOT EXISTS, so a file that
--     failed half-way can simply be applied again;
--   * `{database}` is replaced by the target database name; nothing else is templated;
--   * statements end with `;`; every column carries a COMMENT and every ORDER BY a comment.

CREATE DATABASE IF NOT EXISTS {database}
COMMENT 'Herald analytics: delivery events and the views derived from them';

CREATE TABLE IF NOT EXISTS {database}.schema_migrations
(
    name String COMMENT 'Migration file name, e.g. 0002_delivery_events.sql',
    checksum String COMMENT 'sha256 (hex) of the file bytes as applied',
    applied_at DateTime64(3, 'UTC') COMMENT 'When infra/migrate.py finished applying the file'
)
ENGINE = ReplacingMergeTree(applied_at)
-- One row per file; a second apply of the same file (two migrators racing) collapses into the
-- latest row, and readers use FINAL.
ORDER BY name
COMMENT 'Applied migrations from infra/migrations (see infra/migrate.py)';
