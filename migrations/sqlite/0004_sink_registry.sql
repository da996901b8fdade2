-- The sinks known to the fleet: every sink any replica loaded, with the
-- identity of the version that registered it. Every replica routes at
-- ingest by this set (not by its own plugins folder), so which sinks an
-- event is delivered to does not depend on which replica took it in.
-- A sink leaves the set only by an explicit retire.
CREATE TABLE sinks (
    name          TEXT    PRIMARY KEY,
    version       TEXT    NOT NULL,
    component_sha TEXT    NOT NULL,     -- hex SHA-256 of manifest + component bytes
    registered_at INTEGER NOT NULL,     -- Unix ms, database clock
    retired_at    INTEGER               -- Unix ms; NULL while routed to
);

-- Which replica serves which sink, renewed by each replica's heartbeat.
CREATE TABLE sink_replicas (
    replica       TEXT    NOT NULL,
    sink          TEXT    NOT NULL,
    version       TEXT    NOT NULL,
    component_sha TEXT    NOT NULL,
    beat_at       INTEGER NOT NULL,     -- Unix ms, database clock
    PRIMARY KEY (replica, sink)
);
