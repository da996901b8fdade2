-- Producers: the named callers allowed to post events over HTTP, each
-- with its own bearer token (`outboxd producers create`). The record is
-- the host's own JSON (`auth::Producer`: the token's id and SHA-256
-- digest, never the token; scope, rate limits, expiry, revocation); the
-- store keeps it whole and reads it back, deciding nothing about it.
CREATE TABLE producers (
    name       TEXT    PRIMARY KEY,
    record     TEXT    NOT NULL,
    revision   INTEGER NOT NULL,
    updated_at INTEGER NOT NULL        -- Unix ms, database clock
);

-- Which producer posted each event (NULL: an anonymous post on loopback,
-- a source, or an event stored before this).
ALTER TABLE events ADD COLUMN producer TEXT;
