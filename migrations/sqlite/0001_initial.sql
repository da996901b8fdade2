-- outboxd schema on SQLite. Times are Unix milliseconds (INTEGER), read from
-- the database's clock.

-- One row per event, kept as received.
CREATE TABLE events (
    seq_id          INTEGER PRIMARY KEY,          -- internal row id
    id              TEXT    NOT NULL UNIQUE,      -- CloudEvents id (idempotency key)
    source          TEXT    NOT NULL,
    type            TEXT    NOT NULL,
    subject         TEXT,
    time            TEXT,                         -- producer's time, RFC 3339, if given
    datacontenttype TEXT,
    dataschema      TEXT,
    stream          TEXT    NOT NULL,             -- ordering key (partitionkey)
    sequence        INTEGER NOT NULL,             -- position in the stream
    producer_sequence INTEGER NOT NULL DEFAULT 0, -- 1 when the producer supplied `sequence`
    extensions      TEXT    NOT NULL DEFAULT '{}',-- JSON object name -> text
    data            BLOB    NOT NULL,
    data_format     TEXT    NOT NULL,             -- json | text | binary | none
    content_hash    TEXT    NOT NULL,             -- SHA-256 of the canonical content
    ingested_at     INTEGER NOT NULL,
    UNIQUE (stream, sequence)
);

-- Last sequence given out per stream: the ingest transaction bumps it, so
-- sequences are strictly increasing and (when assigned by outboxd) gapless.
CREATE TABLE streams (
    stream        TEXT    PRIMARY KEY,
    last_sequence INTEGER NOT NULL
);

-- One row per (event, sink). status: pending (waiting, leased or waiting to
-- retry), delivered, dead.
CREATE TABLE deliveries (
    id               INTEGER PRIMARY KEY,
    event_id         TEXT    NOT NULL REFERENCES events (id),
    sink             TEXT    NOT NULL,
    stream           TEXT    NOT NULL,
    sequence         INTEGER NOT NULL,
    status           TEXT    NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivered', 'dead')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  INTEGER NOT NULL,
    first_attempt_at INTEGER,
    lease_token      TEXT,
    lease_expires_at INTEGER,
    last_error       TEXT,
    created_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    UNIQUE (event_id, sink)
);

-- Head-of-stream probe: live rows of one (sink, stream) by sequence.
CREATE INDEX deliveries_live ON deliveries (sink, stream, sequence) WHERE status = 'pending';
-- Due scan: live rows of one sink by due time.
CREATE INDEX deliveries_due ON deliveries (sink, next_attempt_at) WHERE status = 'pending';
