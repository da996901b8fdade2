-- The sinks known to the fleet: every sink any replica loaded, with the
-- identity of the version that registered it. Every replica routes at
-- ingest by this set (not by its own plugins folder), so which sinks an
-- event is delivered to does not depend on which replica took it in.
-- A sink leaves the set only by an explicit retire.
CREATE TABLE outboxd.sinks (
    name          text    PRIMARY KEY,
    version       text    NOT NULL,
    component_sha text    NOT NULL,     -- hex SHA-256 of manifest + component bytes
    registered_at bigint  NOT NULL,     -- Unix ms, database clock
    retired_at    bigint                -- Unix ms; NULL while routed to
);

-- Which replica serves which sink, renewed by each replica's heartbeat.
CREATE TABLE outboxd.sink_replicas (
    replica       text    NOT NULL,
    sink          text    NOT NULL,
    version       text    NOT NULL,
    component_sha text    NOT NULL,
    beat_at       bigint  NOT NULL,     -- Unix ms, database clock
    PRIMARY KEY (replica, sink)
);
