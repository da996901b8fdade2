-- Event search by producer (GET /v1/admin/events?producer=, the console's
-- events page), newest first: one backward index scan. Partial: events
-- posted anonymously on loopback or enqueued by SQL (producer NULL) add
-- nothing to it, so only authenticated producers' ingest pays for it.
CREATE INDEX events_producer_ingested ON outboxd.events (producer, ingested_at, seq_id)
    WHERE producer IS NOT NULL;
