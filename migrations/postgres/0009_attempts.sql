-- The history of failed attempts (GET /v1/admin/attempts, the console's
-- attempts page): one row per attempt that did not deliver — retried,
-- dead-lettered, trapped, timed out — written in the transaction of that
-- attempt's finish. A delivered attempt writes nothing here, so the happy
-- path pays nothing. Bounded: at most limits::ATTEMPTS_KEPT rows per
-- (event, delivery key), the oldest dropped as a new one is written, and
-- rows older than delivery.retention deleted by the retention loop.
CREATE TABLE outboxd.attempts (
    id           bigserial   PRIMARY KEY,
    event_id     text        NOT NULL,            -- the event (no foreign key: purges of events and
                                                  -- deliveries never wait on this table)
    sink         text        NOT NULL,            -- the delivery key: a sink, or one destination of it
    stream       text        NOT NULL,
    sequence     bigint      NOT NULL,
    attempt      integer     NOT NULL,            -- the delivery's attempt number (from 1)
    attempted_at timestamptz NOT NULL DEFAULT now(), -- when the failure was recorded (database clock)
    duration_ms  bigint,                          -- the plugin call's wall time, when known
    outcome      text        NOT NULL,            -- retry | dead | trap | timeout
    status       text,                            -- the receiver's HTTP status or the broker's answer
    reason       text        NOT NULL
);
-- A destination's attempts, newest first.
CREATE INDEX attempts_sink ON outboxd.attempts (sink, attempted_at);
-- An event's attempts, and the per-delivery bound (newest by id).
CREATE INDEX attempts_event ON outboxd.attempts (event_id, sink, id);
-- Retention, and the unfiltered listing, by time.
CREATE INDEX attempts_at ON outboxd.attempts (attempted_at);
