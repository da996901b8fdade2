-- Event search by delivery state (GET /v1/admin/events?state=, the
-- console's events page): the deliveries a claim has taken and that are
-- not finished — leased, with a lease run out, or waiting to retry
-- (plan::TRIED_SQL, which the state conditions of leased and retrying
-- repeat word for word, as SQLite needs to use a partial index). Few rows
-- next to a backlog; a search for either state reads them first instead
-- of testing every event newest first. An UPDATE writes this index only
-- when a row enters or leaves it (a claim, a finish).
CREATE INDEX deliveries_tried ON deliveries (event_id)
    WHERE status = 'pending' AND (lease_expires_at IS NOT NULL OR attempts > 0);
