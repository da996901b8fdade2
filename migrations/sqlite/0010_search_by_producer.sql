-- Event search by producer (GET /v1/admin/events?producer=, the console's
-- events page), newest first: one backward index scan (the rowid is the
-- tie-break). Partial: anonymous events (producer NULL) add nothing to it.
CREATE INDEX events_producer_ingested ON events (producer, ingested_at)
    WHERE producer IS NOT NULL;
