-- Producers: the named callers allowed to post events over HTTP, each
-- with its own bearer token (`outboxd producers create`). The record is
-- the host's own JSON (`auth::Producer`: the token's id and SHA-256
-- digest, never the token; scope, rate limits, expiry, revocation); the
-- store keeps it whole and reads it back, deciding nothing about it.
CREATE TABLE outboxd.producers (
    name       text    PRIMARY KEY,
    record     text    NOT NULL,
    revision   bigint  NOT NULL,
    updated_at bigint  NOT NULL        -- Unix ms, database clock
);

-- Which producer posted each event (NULL: an anonymous post on loopback,
-- a source, the in-transaction outbox, or an event stored before this).
ALTER TABLE outboxd.events ADD COLUMN producer text;
