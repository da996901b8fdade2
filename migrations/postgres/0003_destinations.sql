-- Destinations: configured targets of a sink, managed while running
-- (`/v1/admin/destinations`). A destination's name is the delivery key its
-- deliveries, heads and dead letters are stored under (`deliveries.sink`),
-- so order, retries and dead letters are per destination. The record is
-- the host's own JSON (`destinations::Destination`); the store keeps it
-- whole and reads it back, deciding nothing about it.
CREATE TABLE outboxd.destinations (
    name       text    PRIMARY KEY,
    sink       text    NOT NULL,
    record     text    NOT NULL,
    revision   bigint  NOT NULL,
    updated_at bigint  NOT NULL        -- Unix ms, database clock
);

-- What a destination's delivery loop last saw (last attempt, last success,
-- failing since), kept apart from the record so an operator's update and
-- a loop's report never overwrite each other.
CREATE TABLE outboxd.destination_health (
    name       text    PRIMARY KEY,
    health     text    NOT NULL,
    updated_at bigint  NOT NULL
);
