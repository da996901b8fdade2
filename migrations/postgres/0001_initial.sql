-- outboxd schema on PostgreSQL. Everything lives in the schema `outboxd`, so
-- applications that share the database see it apart from their own tables.
-- Times are timestamptz from the database's clock (now()).

CREATE SCHEMA IF NOT EXISTS outboxd;

-- One row per event, kept as received.
CREATE TABLE outboxd.events (
    seq_id            bigserial   PRIMARY KEY,
    id                text        NOT NULL UNIQUE,    -- CloudEvents id (idempotency key)
    source            text        NOT NULL,
    type              text        NOT NULL,
    subject           text,
    time              text,                           -- producer's time, RFC 3339, if given
    datacontenttype   text,
    dataschema        text,
    stream            text        NOT NULL,           -- ordering key (partitionkey)
    sequence          bigint      NOT NULL,           -- position in the stream
    producer_sequence boolean     NOT NULL DEFAULT false,
    extensions        text        NOT NULL DEFAULT '{}', -- JSON object name -> text
    data              bytea       NOT NULL,
    data_format       text        NOT NULL,           -- json | text | binary | none
    content_hash      text,                           -- SHA-256 of the canonical content (NULL: enqueued by SQL)
    routed            boolean     NOT NULL DEFAULT true, -- false until the daemon created its deliveries
    ingested_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (stream, sequence)
);

-- Events enqueued by SQL (outboxd.enqueue) wait here for the daemon's router.
CREATE INDEX events_unrouted ON outboxd.events (seq_id) WHERE NOT routed;

-- Backfill pages through events by ingest time.
CREATE INDEX events_ingested_at ON outboxd.events (ingested_at);

-- Last sequence given out per stream; ingest locks the row, so sequences are
-- strictly increasing and (when assigned by outboxd) gapless.
CREATE TABLE outboxd.streams (
    stream        text   PRIMARY KEY,
    last_sequence bigint NOT NULL
);

-- One row per (event, sink). status: pending (waiting, leased or waiting to
-- retry), delivered, dead.
CREATE TABLE outboxd.deliveries (
    id               bigserial   PRIMARY KEY,
    event_id         text        NOT NULL REFERENCES outboxd.events (id),
    sink             text        NOT NULL,
    stream           text        NOT NULL,
    sequence         bigint      NOT NULL,
    status           text        NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivered', 'dead')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    first_attempt_at timestamptz,
    lease_token      text,
    lease_expires_at timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    UNIQUE (event_id, sink)
);

-- Live rows of one (sink, stream) by sequence: finds the next head and the
-- contiguous run behind a head.
CREATE INDEX deliveries_live ON outboxd.deliveries (sink, stream, sequence) WHERE status = 'pending';
-- Retention: finished rows by time.
CREATE INDEX deliveries_finished ON outboxd.deliveries (finished_at) WHERE status = 'delivered';
-- Dead letters, for listing, replay and purge.
CREATE INDEX deliveries_dead ON outboxd.deliveries (sink, finished_at) WHERE status = 'dead';

-- Operator state of a sink: paused sinks are not claimed (nothing is lost;
-- deliveries wait). Shared by every replica.
CREATE TABLE outboxd.sink_state (
    sink   text PRIMARY KEY,
    paused boolean NOT NULL
);

-- The head of every (sink, stream) that has live deliveries: its earliest
-- pending delivery, and when it may be claimed (its next attempt time, or
-- its lease expiry while leased). Claims read only this table's due index,
-- so a claim costs O(batch) whatever the backlog or a hot stream's length.
CREATE TABLE outboxd.heads (
    sink        text        NOT NULL,
    stream      text        NOT NULL,
    delivery_id bigint      NOT NULL,
    due_at      timestamptz NOT NULL,
    PRIMARY KEY (sink, stream)
);
CREATE INDEX heads_due ON outboxd.heads (sink, due_at);

-- In-transaction enqueue for applications sharing this database:
--
--   BEGIN;
--   UPDATE orders SET state = 'paid' WHERE id = 42;
--   SELECT outboxd.enqueue('order-42-paid', 'https://shop.example/orders',
--                          'com.example.order.paid', 'orders/42',
--                          '{"order": 42}'::jsonb);
--   COMMIT;
--
-- The event commits (or rolls back) with the application's own change. It is
-- stored at once with its sequence; the daemon then creates its deliveries by
-- the configured routes and delivers it like any other. Idempotent on p_id:
-- the same id with the same source, type, stream and data returns the
-- original sequence; with different content it raises unique_violation.
-- Returns the event's sequence in its stream.
CREATE FUNCTION outboxd.enqueue(
    p_id              text,
    p_source          text,
    p_type            text,
    p_stream          text,
    p_data            jsonb,
    p_subject         text DEFAULT NULL,
    p_datacontenttype text DEFAULT 'application/json'
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    existing outboxd.events%ROWTYPE;
    seq bigint;
BEGIN
    IF p_id IS NULL OR p_id = '' OR p_source IS NULL OR p_source = '' OR p_type IS NULL OR p_type = ''
       OR p_stream IS NULL OR p_stream = '' THEN
        RAISE EXCEPTION 'outboxd.enqueue: id, source, type and stream are required'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO existing FROM outboxd.events WHERE id = p_id;
    IF FOUND THEN
        IF existing.source = p_source AND existing.type = p_type AND existing.stream = p_stream
           AND existing.data = convert_to(p_data::text, 'UTF8') THEN
            RETURN existing.sequence;
        END IF;
        RAISE EXCEPTION 'outboxd.enqueue: event % was already stored with different content', p_id
            USING ERRCODE = 'unique_violation';
    END IF;
    INSERT INTO outboxd.streams (stream, last_sequence) VALUES (p_stream, 0) ON CONFLICT (stream) DO NOTHING;
    UPDATE outboxd.streams SET last_sequence = last_sequence + 1 WHERE stream = p_stream
        RETURNING last_sequence INTO seq;
    INSERT INTO outboxd.events (id, source, type, subject, datacontenttype, stream, sequence, data,
                                data_format, routed)
    VALUES (p_id, p_source, p_type, p_subject, p_datacontenttype, p_stream, seq,
            convert_to(p_data::text, 'UTF8'), 'json', false);
    PERFORM pg_notify('outboxd_wake', 'route');
    RETURN seq;
END
$$;
