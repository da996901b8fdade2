-- Event search (GET /v1/admin/events) with no filter but time, or with a
-- state: newest first is ORDER BY ingested_at DESC, seq_id DESC. Events
-- stored in one transaction share one ingested_at, so an index on
-- ingested_at alone leaves the tie-break to a sort of every event (939 ms
-- at p99 over 1,000,000 events of one fill, bench/results/
-- 2026-12-04-console-pages.md); with seq_id in the index it is one
-- backward index scan that stops at the page. The new index serves
-- everything the old one did (backfill pages by ingest time, time
-- ranges), so the old one goes: one index less to write per ingest.
-- Nothing here covers a column the claim path updates.
CREATE INDEX events_ingested_seq ON outboxd.events (ingested_at, seq_id);
DROP INDEX outboxd.events_ingested_at;
