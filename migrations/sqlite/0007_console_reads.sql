-- Reads of the console and the admin API. Event search (GET
-- /v1/admin/events) by type or source, newest first; by id it uses
-- events.id's unique index, by stream (stream, sequence), by time
-- events_ingested_at. A stream's heads (GET /v1/admin/streams/{stream})
-- by stream across every delivery key.
CREATE INDEX events_type_ingested ON events (type, ingested_at);
CREATE INDEX events_source_ingested ON events (source, ingested_at);
CREATE INDEX heads_stream ON heads (stream);
