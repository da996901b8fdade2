-- Event search by delivery state (GET /v1/admin/events?state=, the
-- console's events page), newest first, without reading the whole store
-- for a rare state (docs/console.md has the plans at 1,000,000 events).
--
-- The deliveries a claim has taken and that are not finished: leased, with
-- a lease run out, or waiting to retry (plan::TRIED_SQL, which the state
-- conditions of leased and retrying repeat). Few rows next to a backlog,
-- read whole by a search for either state instead of a scan of every
-- delivery or a walk of the events.
--
-- Its predicate names lease_expires_at and attempts, which a claim sets,
-- and so the claim's UPDATE, and a retry's or a release's, are no longer
-- heap-only (HOT) updates: each writes its new row version into the
-- deliveries' indexes. Measured with the claim's and the finish's own SQL
-- (docs/console.md), a claim was HOT for about one row in five before
-- (20% of 180,000 claimed rows in steady state; 16 of 99 taking heads off
-- a filled backlog): with fillfactor 100 a row's page is full by the time
-- it is claimed, so most claims already wrote every index, and a delivered
-- or dead finish always does (status is in three partial indexes). The
-- claim's UPDATE of 100 rows took about 10% longer at p50 (6.5-7.0 ms
-- without, 6.7-8.2 ms with, three runs each), within the runs' spread.
CREATE INDEX deliveries_tried ON outboxd.deliveries (event_id)
    WHERE status = 'pending' AND (lease_expires_at IS NOT NULL OR attempts > 0);
-- A rare state's matches are ordered by their events' (ingested_at,
-- seq_id): from this index alone (an index-only scan) instead of one events
-- row per match, read from disk when cold. Nothing here is ever updated,
-- so events' updates (routed, content_hash) stay as they were.
CREATE INDEX events_id_order ON outboxd.events (id) INCLUDE (ingested_at, seq_id);
