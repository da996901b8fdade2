-- Destinations: configured targets of a sink, managed while running
-- (`/v1/admin/destinations`). A destination's name is the delivery key its
-- deliveries, heads and dead letters are stored under (`deliveries.sink`),
-- so order, retries and dead letters are per destination. The record is
-- the host's own JSON (`destinations::Destination`); the store keeps it
-- whole and reads it back, deciding nothing about it.
CREATE TABLE destinations (
    name       TEXT    PRIMARY KEY,
    sink       TEXT    NOT NULL,
    record     TEXT    NOT NULL,
    revision   INTEGER NOT NULL,
    updated_at INTEGER NOT NULL        -- Unix ms, database clock
);

-- What a destination's delivery loop last saw (last attempt, last success,
-- failing since), kept apart from the record so an operator's update and
-- a loop's report never overwrite each other.
CREATE TABLE destination_health (
    name       TEXT    PRIMARY KEY,
    health     TEXT    NOT NULL,
    updated_at INTEGER NOT NULL
);
