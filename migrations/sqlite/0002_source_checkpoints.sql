-- Where each configured source (`[sources.NAME]`) last left off, e.g. a
-- CouchDB `_changes` sequence. A checkpoint is only a shortcut: a source
-- must still find work it skipped (its periodic scan), so losing this row
-- loses no event.
CREATE TABLE source_checkpoints (
    source     TEXT    PRIMARY KEY,
    checkpoint TEXT    NOT NULL,       -- opaque to the store; the source's own format
    updated_at INTEGER NOT NULL        -- Unix ms, database clock
);
