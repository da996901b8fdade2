//! The Cypher text of the relay, built once per configuration from its
//! label, property names, the owner's state words and time encoding
//! ([`Queries`]).
//!
//! Must never: put a value into query text (values are parameters; names
//! are validated identifiers, state words validated plain words), write a
//! query that is not index-backed or that sorts what an index gives in
//! order, or treat a time it cannot read as due.

use super::*;

/// The queries of the relay, built once for a configuration.
#[derive(Debug, Clone)]
pub struct Queries {
    /// `CREATE INDEX … IF NOT EXISTS`, one per index the queries seek.
    pub indexes: Vec<String>,
    /// One per lane (waiting, failed, in flight): `$after` cursor, `$page`
    /// size, `$reclaim` (ids of in-flight nodes whose unreadable lease has
    /// been waited out). Each row: `id`, `due`, `head` (no earlier live
    /// version of its stream) and `bad` (the property, by its configured
    /// key, whose value is not in the configured encoding, or null).
    pub shortlist: [(&'static str, String); 3],
    /// The head of each of `$streams` (string stream values): its live node
    /// of the least version, one seek of the `(stream, status, version)`
    /// index per live status, whether it is due, and `bad` as the lanes.
    /// Asked for the streams whose head this relay just finished, so their
    /// next node is found without paging the lanes (see
    /// [`Outbox::shortlist`]).
    pub successors: String,
    /// The next 16 stream values after `$after` (string), in
    /// order, one index seek each: the streams the walk asks
    /// [`Queries::successors`] about next (see [`Outbox::shortlist`]).
    pub walk: String,
    /// Takes the shortlisted nodes (`$ids`) still eligible and at their
    /// stream's head: in flight under `$token` for `$lease_ms`, attempts +
    /// 1, the lease owner `$owner` when the owner keeps one.
    pub claim: String,
    /// Extends the lease of in-flight nodes (`$ids`, `$tokens`) by
    /// `$lease_ms` where their token still matches; returns the ids kept.
    pub renew: String,
    /// Marks claimed nodes (`$ids`, `$tokens`) delivered, when their lease
    /// token still matches.
    pub finish_delivered: String,
    /// Marks claimed nodes failed with their next attempt time (`$delays`
    /// ms) and reason, when their lease token still matches.
    pub finish_failed: String,
    /// Marks claimed nodes refused with the reason, when their lease token
    /// still matches: the owner's dead word, or — the owner has none —
    /// failed and due again after `$delays` ms.
    pub finish_dead: String,
    /// Deletes up to `$limit` nodes delivered more than `$older_ms` ago.
    pub retention: String,
    /// Age of the oldest waiting node by its created-at, ms (lag metric).
    pub oldest_pending: String,
    /// Marks refused the waiting nodes whose event id is missing or not a
    /// string (the shortlist, keyset-paged on the id, never sees them).
    /// Hinted to the `(status)` index: a composite index holds only nodes
    /// that have every one of its properties.
    pub missing_id: String,
    /// Up to `$limit` nodes whose status is a string but none of the
    /// configured words (`id`, `status`): range seeks of the `(status)`
    /// index between the words, so known statuses are never read.
    pub unknown_status: String,
}

/// Cypher fragments for the relay's time properties in one encoding.
struct Times(TimeEncoding);

impl Times {
    /// True when `x` holds a time in this encoding.
    fn is_time(&self, x: &str) -> String {
        match self.0 {
            TimeEncoding::Datetime => format!("{x} IS :: ZONED DATETIME NOT NULL"),
            _ => format!("({x} IS :: INTEGER NOT NULL OR {x} IS :: FLOAT NOT NULL)"),
        }
    }

    /// The database clock's now, comparable with a time of this encoding.
    fn now(&self) -> &'static str {
        match self.0 {
            TimeEncoding::Datetime => "datetime()",
            TimeEncoding::EpochMillisFloat => "toFloat(datetime().epochMillis)",
            _ => "datetime().epochMillis",
        }
    }

    /// `ms` milliseconds from now (database clock), as stored.
    fn later(&self, ms: &str) -> String {
        match self.0 {
            TimeEncoding::Datetime => format!("datetime() + duration({{milliseconds: {ms}}})"),
            TimeEncoding::EpochMillisFloat => format!("toFloat(datetime().epochMillis + {ms})"),
            _ => format!("datetime().epochMillis + {ms}"),
        }
    }

    /// `ms` milliseconds ago (database clock), comparable with a time.
    fn ago(&self, ms: &str) -> String {
        match self.0 {
            TimeEncoding::Datetime => format!("datetime() - duration({{milliseconds: {ms}}})"),
            _ => format!("datetime().epochMillis - {ms}"),
        }
    }
}

impl Queries {
    /// Every query with a name, for plan checks.
    pub fn all(&self) -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = self
            .shortlist
            .iter()
            .map(|(lane, q)| (format!("shortlist {lane}"), q.clone()))
            .collect();
        all.extend([
            ("successors".to_string(), self.successors.clone()),
            ("walk".to_string(), self.walk.clone()),
            ("claim".to_string(), self.claim.clone()),
            ("renew".to_string(), self.renew.clone()),
            (
                "finish delivered".to_string(),
                self.finish_delivered.clone(),
            ),
            ("finish failed".to_string(), self.finish_failed.clone()),
            ("finish dead".to_string(), self.finish_dead.clone()),
            ("retention".to_string(), self.retention.clone()),
            ("oldest pending".to_string(), self.oldest_pending.clone()),
            ("missing id".to_string(), self.missing_id.clone()),
            ("unknown status".to_string(), self.unknown_status.clone()),
        ]);
        all
    }

    /// Build the queries of `config` (already validated).
    ///
    /// Long on purpose: every query is one format string over the same
    /// backquoted label, property names and state words, and they read
    /// best side by side (the claim and the fenced finishes must agree on
    /// states and lease properties); split, each part would re-derive the
    /// names.
    pub fn new(config: &Neo4jSourceConfig) -> Queries {
        let l = format!("`{}`", config.label);
        let p = &config.properties;
        let w = &config.statuses;
        let t = Times(config.time_encoding);
        let q = |s: &str| format!("`{s}`");
        let (id, stream, version, status) = (
            q(&p.event_id),
            q(&p.stream),
            q(&p.stream_version),
            q(&p.status),
        );
        let (attempts, next_at, created) =
            (q(&p.attempts), q(&p.next_attempt_at), q(&p.created_at));
        let (token, expires, last_error, delivered_at, lock) = (
            q(&p.lease_token),
            q(&p.lease_expires_at),
            q(&p.last_error),
            q(&p.delivered_at),
            q(&p.lock),
        );
        let (pending, failed, inflight, delivered) = (
            format!("'{}'", w.pending),
            format!("'{}'", w.failed),
            format!("'{}'", w.in_flight),
            format!("'{}'", w.delivered),
        );
        let live = format!("[{pending}, {failed}, {inflight}]");
        let now = t.now();
        let label = &config.label;
        let indexes = vec![
            format!("CREATE INDEX `outboxd_{label}_event_id` IF NOT EXISTS FOR (n:{l}) ON (n.{id})"),
            format!("CREATE INDEX `outboxd_{label}_status` IF NOT EXISTS FOR (n:{l}) ON (n.{status})"),
            format!("CREATE INDEX `outboxd_{label}_status_event_id` IF NOT EXISTS FOR (n:{l}) ON (n.{status}, n.{id})"),
            format!("CREATE INDEX `outboxd_{label}_stream_status_version` IF NOT EXISTS FOR (n:{l}) ON (n.{stream}, n.{status}, n.{version})"),
            format!("CREATE INDEX `outboxd_{label}_status_delivered_at` IF NOT EXISTS FOR (n:{l}) ON (n.{status}, n.{delivered_at})"),
            format!("CREATE INDEX `outboxd_{label}_status_created_at` IF NOT EXISTS FOR (n:{l}) ON (n.{status}, n.{created})"),
        ];
        // No earlier version of n's stream still to relay. Seeks the
        // (stream, status, version) index once per live status.
        let no_earlier = format!(
            "NOT EXISTS {{ MATCH (e:{l}) WHERE e.{stream} = n.{stream} AND e.{status} IN {live} AND e.{version} < n.{version} }}"
        );
        // A failed node is due when its next attempt time has come (or it
        // has none); one whose time is in another encoding never is.
        let due_failed = format!(
            "CASE WHEN n.{next_at} IS NULL THEN true WHEN {} THEN n.{next_at} <= {now} ELSE false END",
            t.is_time(&format!("n.{next_at}"))
        );
        // An in-flight node is due when its lease has expired; one whose
        // expiry cannot be read only once the relay has waited it out
        // (`$reclaim`).
        let expired = format!(
            "CASE WHEN {} THEN n.{expires} <= {now} ELSE n.{id} IN $reclaim END",
            t.is_time(&format!("n.{expires}"))
        );
        // Re-reading the status narrows the race with another relay's
        // finish (read committed); the relay reports a node only when it
        // sees it so twice.
        let bad_failed = format!(
            "CASE WHEN n.{status} = {failed} AND n.{next_at} IS NOT NULL AND NOT ({}) THEN 'next-attempt-at' END",
            t.is_time(&format!("n.{next_at}"))
        );
        let bad_inflight = format!(
            "CASE WHEN n.{status} = {inflight} AND NOT ({}) THEN 'lease-expires-at' END",
            t.is_time(&format!("n.{expires}"))
        );
        // Every ORDER BY names the index's properties from the first one:
        // Neo4j 5 reads the index in order only then (ordered by the last
        // property alone, it reads every entry of the seek and sorts them,
        // which is the whole lane at each page).
        let lane = |status_value: &str, due: &str, bad: &str| {
            format!(
                "MATCH (n:{l}) USING INDEX n:{l}({status}, {id}) \
                 WHERE n.{status} = {status_value} AND n.{id} > $after \
                 WITH n ORDER BY n.{status} ASC, n.{id} ASC LIMIT $page \
                 RETURN n.{id} AS id, {due} AS due, {no_earlier} AS head, {bad} AS bad"
            )
        };
        let shortlist = [
            (PENDING, lane(&pending, "true", "null")),
            (FAILED, lane(&failed, &due_failed, &bad_failed)),
            (INFLIGHT, lane(&inflight, &expired, &bad_inflight)),
        ];
        let eligible = format!(
            "(n.{status} = {pending} \
              OR (n.{status} = {failed} AND {due_failed}) \
              OR (n.{status} = {inflight} AND {expired}))"
        );
        let seek = |status_value: &str| {
            format!(
                "WITH s MATCH (n:{l}) USING INDEX n:{l}({stream}, {status}, {version}) \
                 WHERE n.{stream} = s AND n.{status} = {status_value} AND n.{version} IS NOT NULL \
                 RETURN n ORDER BY n.{stream} ASC, n.{status} ASC, n.{version} ASC LIMIT 1"
            )
        };
        // The least of the (at most three) seeks' nodes, without a sort.
        let successors = format!(
            "UNWIND $streams AS s \
             CALL {{ {} UNION {} UNION {} }} \
             WITH s, collect(n) AS ns \
             WITH reduce(m = null, x IN ns | CASE WHEN m IS NULL OR x.{version} < m.{version} THEN x ELSE m END) AS n \
             WITH n WHERE n.{id} IS :: STRING NOT NULL \
             RETURN n.{id} AS id, {eligible} AS due, \
               CASE n.{status} WHEN {failed} THEN {bad_failed} WHEN {inflight} THEN {bad_inflight} END AS bad",
            seek(&pending),
            seek(&failed),
            seek(&inflight)
        );
        // The next WALK_STEPS stream values after `$after`, in order: each
        // step one seek of the (stream, status, version) index past the
        // previous stream (its other nodes are not read), null once the
        // streams run out (OPTIONAL MATCH keeps the row).
        let mut walk = String::from("WITH $after AS s0");
        for i in 1..=WALK_STEPS {
            walk.push_str(&format!(
                " CALL {{ WITH s{prev} OPTIONAL MATCH (n:{l}) USING INDEX n:{l}({stream}, {status}, {version}) \
                 WHERE n.{stream} > s{prev} AND n.{status} IS NOT NULL AND n.{version} IS NOT NULL \
                 WITH n ORDER BY n.{stream} ASC LIMIT 1 RETURN n.{stream} AS s{i} }}",
                prev = i - 1,
            ));
        }
        let steps: Vec<String> = (1..=WALK_STEPS).map(|i| format!("s{i}")).collect();
        walk.push_str(&format!(
            " RETURN [s IN [{}] WHERE s IS NOT NULL] AS streams",
            steps.join(", ")
        ));
        let text = |prop: &Option<String>| match prop {
            Some(p) => format!("toStringOrNull(n.`{p}`)"),
            None => "null".to_string(),
        };
        let data = q(&config.event.data_property);
        let (time_prop, time_encoding) = event_time(config);
        let time = q(&time_prop);
        let time_text = match time_encoding {
            TimeEncoding::Datetime => {
                format!(
                    "CASE WHEN n.{time} IS :: ZONED DATETIME NOT NULL THEN toString(n.{time}) END"
                )
            }
            TimeEncoding::Iso8601 => {
                format!("CASE WHEN n.{time} IS :: STRING NOT NULL THEN n.{time} END")
            }
            _ => format!(
                "CASE WHEN n.{time} IS :: INTEGER NOT NULL OR n.{time} IS :: FLOAT NOT NULL \
                 THEN toString(datetime({{epochMillis: toInteger(n.{time})}})) END"
            ),
        };
        let ty = match &config.event.type_template {
            Some(_) => "null".to_string(),
            None => format!("toStringOrNull(n.`{}`)", config.event.type_property),
        };
        let (owner_set, owner_remove) = match &p.lease_owner {
            Some(o) => (format!(", n.`{o}` = $owner"), format!(", n.`{o}`")),
            None => (String::new(), String::new()),
        };
        let claim = format!(
            "UNWIND $ids AS claim_id \
             MATCH (n:{l}) WHERE n.{id} = claim_id \
             SET n.{lock} = $token \
             REMOVE n.{lock} \
             WITH n WHERE {eligible} AND {no_earlier} \
             WITH n, n.{status} = {inflight} AS reclaimed \
             SET n.{status} = {inflight}, n.{token} = $token, \
                 n.{expires} = {later}, \
                 n.{attempts} = coalesce(toIntegerOrNull(n.{attempts}), 0) + 1{owner_set} \
             RETURN n.{id} AS id, n.{attempts} AS attempts, reclaimed, \
               CASE WHEN n.{stream} IS :: STRING NOT NULL THEN n.{stream} END AS stream, \
               toStringOrNull(n.{stream}) AS stream_text, \
               CASE WHEN n.{version} IS :: INTEGER NOT NULL THEN n.{version} END AS version, \
               toStringOrNull(n.{version}) AS version_text, \
               {ty} AS type, {source} AS source, {subject} AS subject, \
               {time_text} AS time, n.{time} IS NOT NULL AS has_time, \
               CASE WHEN n.{data} IS :: STRING NOT NULL THEN n.{data} END AS data, \
               n.{data} IS NOT NULL AS has_data, \
               [k IN keys(n) WHERE k <> '{data_name}' | k] AS prop_keys, \
               [k IN keys(n) WHERE k <> '{data_name}' | toStringOrNull(n[k])] AS prop_values",
            later = t.later("$lease_ms"),
            source = text(&config.event.source_property),
            subject = text(&config.event.subject_property),
            data_name = config.event.data_property,
        );
        let fenced = format!(
            "UNWIND range(0, size($ids) - 1) AS i \
             MATCH (n:{l}) WHERE n.{id} = $ids[i] AND n.{status} = {inflight} AND n.{token} = $tokens[i]"
        );
        let renew = format!(
            "{fenced} SET n.{expires} = {later} RETURN collect(n.{id}) AS kept",
            later = t.later("$lease_ms")
        );
        let finish_delivered = format!(
            "{fenced} SET n.{status} = {delivered}, n.{delivered_at} = {now}, n.{last_error} = null \
             REMOVE n.{token}, n.{expires}{owner_remove} RETURN count(n) AS kept"
        );
        let fail_with = |word: &str| {
            format!(
                "{fenced} SET n.{status} = {word}, n.{last_error} = $reasons[i], \
                 n.{next_at} = {later} \
                 REMOVE n.{token}, n.{expires}{owner_remove} RETURN count(n) AS kept",
                later = t.later("$delays[i]")
            )
        };
        let finish_failed = fail_with(&failed);
        let finish_dead = match &w.dead {
            Some(dead) => format!(
                "{fenced} SET n.{status} = '{dead}', n.{last_error} = $reasons[i] \
                 REMOVE n.{token}, n.{expires}{owner_remove} RETURN count(n) AS kept"
            ),
            None => fail_with(&failed),
        };
        let retention = format!(
            "MATCH (n:{l}) WHERE n.{status} = {delivered} AND n.{delivered_at} < {cutoff} \
             WITH n LIMIT $limit DETACH DELETE n RETURN count(*) AS deleted",
            cutoff = t.ago("$older_ms")
        );
        let (created_known, age) = match config.time_encoding {
            TimeEncoding::Datetime => (
                format!("n.{created} IS :: ZONED DATETIME NOT NULL"),
                format!("duration.inSeconds(n.{created}, datetime()).milliseconds"),
            ),
            _ => (
                format!("n.{created} >= 0"),
                format!("toInteger(datetime().epochMillis - n.{created})"),
            ),
        };
        let oldest_pending = format!(
            "MATCH (n:{l}) USING INDEX n:{l}({status}, {created}) \
             WHERE n.{status} = {pending} AND {created_known} \
             WITH n ORDER BY n.{status} ASC, n.{created} ASC LIMIT 1 \
             RETURN {age} AS age_ms"
        );
        // Refused: the dead word, or — the owner has none — failed and due
        // after `$delay_ms`; then only waiting nodes are swept, so a node
        // refused once is not counted again at every sweep.
        let (sweep_statuses, refuse) = match &w.dead {
            Some(dead) => (
                format!("[{pending}, {failed}]"),
                format!("n.{status} = '{dead}'"),
            ),
            None => (
                format!("[{pending}]"),
                format!(
                    "n.{status} = {failed}, n.{next_at} = {}",
                    t.later("$delay_ms")
                ),
            ),
        };
        let missing_id = format!(
            "MATCH (n:{l}) USING INDEX n:{l}({status}) WHERE n.{status} IN {sweep_statuses} AND NOT (n.{id} IS :: STRING NOT NULL) \
             WITH n LIMIT $limit \
             SET {refuse}, n.{last_error} = $reason RETURN count(n) AS dead"
        );
        let unknown_status = unknown_status_query(&l, &status, &id, w);
        Queries {
            missing_id,
            indexes,
            shortlist,
            successors,
            walk,
            claim,
            renew,
            finish_delivered,
            finish_failed,
            finish_dead,
            retention,
            oldest_pending,
            unknown_status,
        }
    }
}

/// The property holding the event's time and its encoding.
pub fn event_time(config: &Neo4jSourceConfig) -> (String, TimeEncoding) {
    let m = &config.event;
    (
        m.time_property
            .clone()
            .unwrap_or_else(|| config.properties.created_at.clone()),
        m.time_encoding.unwrap_or(config.time_encoding),
    )
}

/// Nodes whose status is a string but none of the state words: one range
/// seek of the `(status)` index below the least word, between each two
/// words and above the greatest, so no node of a known status is read.
fn unknown_status_query(l: &str, status: &str, id: &str, w: &StatusWords) -> String {
    let mut words: Vec<&str> = vec![&w.pending, &w.in_flight, &w.failed, &w.delivered];
    words.extend(w.dead.as_deref());
    words.sort();
    let mut ranges = vec![format!("n.{status} < '{}'", words[0])];
    for pair in words.windows(2) {
        ranges.push(format!(
            "n.{status} > '{}' AND n.{status} < '{}'",
            pair[0], pair[1]
        ));
    }
    ranges.push(format!("n.{status} > '{}'", words[words.len() - 1]));
    let branches: Vec<String> = ranges
        .iter()
        .map(|range| {
            format!(
                "MATCH (n:{l}) USING INDEX n:{l}({status}) WHERE {range} \
                 RETURN n ORDER BY n.{status} ASC LIMIT $limit"
            )
        })
        .collect();
    format!(
        "CALL {{ {} }} WITH n LIMIT $limit \
         RETURN toStringOrNull(n.{id}) AS id, n.{status} AS status",
        branches.join(" UNION ")
    )
}

/// The properties the relay reads or writes itself, which never become
/// extension attributes: the `properties` table (the lease owner and lock
/// included), the data, type, time, source and subject properties.
pub fn own_properties(config: &Neo4jSourceConfig) -> Vec<String> {
    let p = &config.properties;
    let m = &config.event;
    let mut own: Vec<String> = [
        &p.event_id,
        &p.stream,
        &p.stream_version,
        &p.status,
        &p.attempts,
        &p.next_attempt_at,
        &p.created_at,
        &p.lease_token,
        &p.lease_expires_at,
        &p.lock,
        &p.last_error,
        &p.delivered_at,
        &m.data_property,
    ]
    .into_iter()
    .cloned()
    .collect();
    if m.type_template.is_none() {
        own.push(m.type_property.clone());
    }
    own.extend(p.lease_owner.iter().cloned());
    own.extend(m.time_property.iter().cloned());
    own.extend(m.source_property.iter().cloned());
    own.extend(m.subject_property.iter().cloned());
    own
}
