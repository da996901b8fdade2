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

-- Backfill pages through events by ingest time.
CREATE INDEX events_ingested_at ON events (ingested_at);

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

-- Live rows of one (sink, stream) by sequence: finds the next head and the
-- contiguous run behind a head.
CREATE INDEX deliveries_live ON deliveries (sink, stream, sequence) WHERE status = 'pending';
-- Retention: finished rows by time.
CREATE INDEX deliveries_finished ON deliveries (finished_at) WHERE status = 'delivered';
-- Dead letters, for listing, replay and purge.
CREATE INDEX deliveries_dead ON deliveries (sink, finished_at) WHERE status = 'dead';

-- Operator state of a sink: paused sinks are not claimed (nothing is lost;
-- deliveries wait). Shared by every replica.
CREATE TABLE sink_state (
    sink   TEXT PRIMARY KEY,
    paused INTEGER NOT NULL
);

-- The head of every (sink, stream) that has live deliveries: its earliest
-- pending delivery, and when it may be claimed (its next attempt time, or
-- its lease expiry while leased). Claims read only this table's due index,
-- so a claim costs O(batch) whatever the backlog or a hot stream's length.
CREATE TABLE heads (
    sink        TEXT    NOT NULL,
    stream      TEXT    NOT NULL,
    delivery_id INTEGER NOT NULL,
    due_at      INTEGER NOT NULL,
    PRIMARY KEY (sink, stream)
);
CREATE INDEX heads_due ON heads (sink, due_at);
