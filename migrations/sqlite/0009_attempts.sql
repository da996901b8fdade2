-- The history of failed attempts (GET /v1/admin/attempts, the console's
-- attempts page): one row per attempt that did not deliver — retried,
-- dead-lettered, trapped, timed out — written in the transaction of that
-- attempt's finish. A delivered attempt writes nothing here, so the happy
-- path pays nothing. Bounded: at most limits::ATTEMPTS_KEPT rows per
-- (event, delivery key), the oldest dropped as a new one is written, and
-- rows older than delivery.retention deleted by the retention loop.
CREATE TABLE attempts (
    id           INTEGER PRIMARY KEY AUTOINCREMENT, -- never reused: the bound keeps the newest by id
    event_id     TEXT    NOT NULL,
    sink         TEXT    NOT NULL,                  -- the delivery key: a sink, or one destination of it
    stream       TEXT    NOT NULL,
    sequence     INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,                  -- the delivery's attempt number (from 1)
    attempted_at INTEGER NOT NULL,                  -- Unix ms, database clock, when the failure was recorded
    duration_ms  INTEGER,                           -- the plugin call's wall time, when known
    outcome      TEXT    NOT NULL,                  -- retry | dead | trap | timeout
    status       TEXT,                              -- the receiver's HTTP status or the broker's answer
    reason       TEXT    NOT NULL
);
-- A destination's attempts, newest first.
CREATE INDEX attempts_sink ON attempts (sink, attempted_at);
-- An event's attempts, and the per-delivery bound (newest by id).
CREATE INDEX attempts_event ON attempts (event_id, sink, id);
-- Retention, and the unfiltered listing, by time.
CREATE INDEX attempts_at ON attempts (attempted_at);
