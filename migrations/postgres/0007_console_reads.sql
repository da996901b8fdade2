-- Reads of the console and the admin API. Event search (GET
-- /v1/admin/events) by type or source, newest first; by id it uses
-- events.id's unique index, by stream (stream, sequence), by time
-- events_ingested_at. A stream's heads (GET /v1/admin/streams/{stream})
-- by stream across every delivery key. The event indexes end in seq_id,
-- the search's tie-break, so newest-first is one backward index scan
-- (SQLite's carry the rowid, seq_id, already).
CREATE INDEX events_type_ingested ON outboxd.events (type, ingested_at, seq_id);
CREATE INDEX events_source_ingested ON outboxd.events (source, ingested_at, seq_id);
CREATE INDEX heads_stream ON outboxd.heads (stream);
