//! The Cypher text of the relay, built once per configuration from its
//! label and property names ([`Queries`]).
//!
//! Must never: put a value into query text (values are parameters; names
//! are validated identifiers), or write a query that is not index-backed
//! or that sorts what an index gives in order.

use super::*;

/// The queries of the relay, built once for a label and property names.
#[derive(Debug, Clone)]
pub struct Queries {
    /// `CREATE INDEX … IF NOT EXISTS`, one per index the queries seek.
    pub indexes: Vec<String>,
    /// One per lane: `$after` cursor, `$page` size.
    pub shortlist: [(&'static str, String); 3],
    /// The head of each of `$streams` (string stream values): its live node
    /// of the least version, one seek of the `(stream, status, version)`
    /// index per live status, and whether it is due. Asked for the streams
    /// whose head this relay just finished, so their next node is found
    /// without paging the lanes (see [`Outbox::shortlist`]).
    pub successors: String,
    /// The next 16 stream values after `$after` (string), in
    /// order, one index seek each: the streams the walk asks
    /// [`Queries::successors`] about next (see [`Outbox::shortlist`]).
    pub walk: String,
    /// Takes the shortlisted nodes (`$ids`) still eligible and at their
    /// stream's head: `inflight` under `$token` for `$lease_ms`, attempts + 1.
    pub claim: String,
    /// Marks a claimed node delivered, when its lease token still matches.
    pub finish_delivered: String,
    /// Marks a claimed node failed with its next attempt time, when its
    /// lease token still matches.
    pub finish_failed: String,
    /// Marks a claimed node dead with the reason, when its lease token
    /// still matches.
    pub finish_dead: String,
    /// Deletes up to `$limit` nodes delivered more than `$older_ms` ago.
    pub retention: String,
    /// Age of the oldest pending node by its created-at, ms (lag metric).
    pub oldest_pending: String,
    /// Marks dead the waiting nodes whose event id is missing or not a
    /// string (the shortlist, keyset-paged on the id, never sees them).
    /// Hinted to the `(status)` index: a composite index holds only nodes
    /// that have every one of its properties.
    pub missing_id: String,
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
            (
                "finish delivered".to_string(),
                self.finish_delivered.clone(),
            ),
            ("finish failed".to_string(), self.finish_failed.clone()),
            ("finish dead".to_string(), self.finish_dead.clone()),
            ("retention".to_string(), self.retention.clone()),
            ("oldest pending".to_string(), self.oldest_pending.clone()),
            ("missing id".to_string(), self.missing_id.clone()),
        ]);
        all
    }

    /// Build the queries of `config` (already validated).
    ///
    /// Long on purpose: every query is one format string over the same
    /// backquoted label and property names, and they read best side by
    /// side (the claim and the fenced finishes must agree on status values
    /// and lease properties); split, each part would re-derive the names.
    pub fn new(config: &Neo4jSourceConfig) -> Queries {
        let l = format!("`{}`", config.label);
        let p = &config.properties;
        let q = |s: &str| format!("`{s}`");
        let (id, stream, version, status) = (
            q(&p.event_id),
            q(&p.stream),
            q(&p.stream_version),
            q(&p.status),
        );
        let (attempts, next_at, created) =
            (q(&p.attempts), q(&p.next_attempt_at), q(&p.created_at));
        let (token, expires, last_error, delivered_at) = (
            q(&p.lease_token),
            q(&p.lease_expires_at),
            q(&p.last_error),
            q(&p.delivered_at),
        );
        let live = "['pending', 'failed', 'inflight']";
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
        // Every ORDER BY names the index's properties from the first one:
        // Neo4j 5 reads the index in order only then (ordered by the last
        // property alone, it reads every entry of the seek and sorts them,
        // which is the whole lane at each page).
        let lane = |status_value: &str, due: &str| {
            format!(
                "MATCH (n:{l}) USING INDEX n:{l}({status}, {id}) \
                 WHERE n.{status} = '{status_value}' AND n.{id} > $after \
                 WITH n ORDER BY n.{status} ASC, n.{id} ASC LIMIT $page \
                 RETURN n.{id} AS id, {due} AS due, {no_earlier} AS head"
            )
        };
        let shortlist = [
            (PENDING, lane(PENDING, "true")),
            (
                FAILED,
                lane(
                    FAILED,
                    &format!("coalesce(n.{next_at} <= datetime(), true)"),
                ),
            ),
            (
                INFLIGHT,
                lane(
                    INFLIGHT,
                    &format!("coalesce(n.{expires} <= datetime(), true)"),
                ),
            ),
        ];
        let eligible = format!(
            "(n.{status} = 'pending' \
              OR (n.{status} = 'failed' AND coalesce(n.{next_at} <= datetime(), true)) \
              OR (n.{status} = 'inflight' AND coalesce(n.{expires} <= datetime(), true)))"
        );
        let seek = |status_value: &str| {
            format!(
                "WITH s MATCH (n:{l}) USING INDEX n:{l}({stream}, {status}, {version}) \
                 WHERE n.{stream} = s AND n.{status} = '{status_value}' AND n.{version} IS NOT NULL \
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
             RETURN n.{id} AS id, {eligible} AS due",
            seek(PENDING),
            seek(FAILED),
            seek(INFLIGHT)
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
        let reserved = reserved_properties(config);
        let text = |prop: &Option<String>| match prop {
            Some(p) => format!("toStringOrNull(n.`{p}`)"),
            None => "null".to_string(),
        };
        let data = q(&config.event.data_property);
        let claim = format!(
            "UNWIND $ids AS claim_id \
             MATCH (n:{l}) WHERE n.{id} = claim_id \
             SET n.`{LOCK_PROPERTY}` = $token \
             REMOVE n.`{LOCK_PROPERTY}` \
             WITH n WHERE {eligible} AND {no_earlier} \
             SET n.{status} = 'inflight', n.{token} = $token, \
                 n.{expires} = datetime() + duration({{milliseconds: $lease_ms}}), \
                 n.{attempts} = coalesce(toIntegerOrNull(n.{attempts}), 0) + 1 \
             RETURN n.{id} AS id, n.{attempts} AS attempts, \
               CASE WHEN n.{stream} IS :: STRING NOT NULL THEN n.{stream} END AS stream, \
               toStringOrNull(n.{stream}) AS stream_text, \
               CASE WHEN n.{version} IS :: INTEGER NOT NULL THEN n.{version} END AS version, \
               toStringOrNull(n.{version}) AS version_text, \
               toStringOrNull(n.`{ty}`) AS type, {source} AS source, {subject} AS subject, \
               toStringOrNull(n.{created}) AS time, \
               CASE WHEN n.{data} IS :: STRING NOT NULL THEN n.{data} END AS data, \
               n.{data} IS NOT NULL AS has_data, \
               [k IN keys(n) WHERE NOT k IN {reserved} | k] AS ext_keys, \
               [k IN keys(n) WHERE NOT k IN {reserved} | toStringOrNull(n[k])] AS ext_values",
            ty = config.event.type_property,
            source = text(&config.event.source_property),
            subject = text(&config.event.subject_property),
        );
        let fenced = format!(
            "UNWIND range(0, size($ids) - 1) AS i \
             MATCH (n:{l}) WHERE n.{id} = $ids[i] AND n.{status} = 'inflight' AND n.{token} = $token"
        );
        let finish_delivered = format!(
            "{fenced} SET n.{status} = 'delivered', n.{delivered_at} = datetime(), n.{last_error} = null \
             REMOVE n.{token}, n.{expires} RETURN count(n) AS kept"
        );
        let finish_failed = format!(
            "{fenced} SET n.{status} = 'failed', n.{last_error} = $reasons[i], \
             n.{next_at} = datetime() + duration({{milliseconds: $delays[i]}}) \
             REMOVE n.{token}, n.{expires} RETURN count(n) AS kept"
        );
        let finish_dead = format!(
            "{fenced} SET n.{status} = 'dead', n.{last_error} = $reasons[i] \
             REMOVE n.{token}, n.{expires} RETURN count(n) AS kept"
        );
        let retention = format!(
            "MATCH (n:{l}) WHERE n.{status} = 'delivered' AND n.{delivered_at} < datetime() - duration({{milliseconds: $older_ms}}) \
             WITH n LIMIT $limit DETACH DELETE n RETURN count(*) AS deleted"
        );
        let oldest_pending = format!(
            "MATCH (n:{l}) USING INDEX n:{l}({status}, {created}) \
             WHERE n.{status} = 'pending' AND n.{created} IS :: ZONED DATETIME NOT NULL \
             WITH n ORDER BY n.{status} ASC, n.{created} ASC LIMIT 1 \
             RETURN duration.inSeconds(n.{created}, datetime()).milliseconds AS age_ms"
        );
        let missing_id = format!(
            "MATCH (n:{l}) USING INDEX n:{l}({status}) WHERE n.{status} IN ['pending', 'failed'] AND NOT (n.{id} IS :: STRING NOT NULL) \
             WITH n LIMIT $limit \
             SET n.{status} = 'dead', n.{last_error} = $reason RETURN count(n) AS dead"
        );
        Queries {
            missing_id,
            indexes,
            shortlist,
            successors,
            walk,
            claim,
            finish_delivered,
            finish_failed,
            finish_dead,
            retention,
            oldest_pending,
        }
    }
}

/// The properties of a node that are not extension attributes, as a
/// Cypher list of strings: the ones the relay reads or writes, the lock
/// property, and `event.ignore-properties`.
fn reserved_properties(config: &Neo4jSourceConfig) -> String {
    let p = &config.properties;
    let mut reserved: Vec<String> = [
        &p.event_id,
        &p.stream,
        &p.stream_version,
        &p.status,
        &p.attempts,
        &p.next_attempt_at,
        &p.created_at,
        &p.lease_token,
        &p.lease_expires_at,
        &p.last_error,
        &p.delivered_at,
        &config.event.type_property,
        &config.event.data_property,
    ]
    .into_iter()
    .cloned()
    .collect();
    reserved.push(LOCK_PROPERTY.to_string());
    reserved.extend(config.event.source_property.iter().cloned());
    reserved.extend(config.event.subject_property.iter().cloned());
    reserved.extend(config.event.ignore_properties.iter().cloned());
    format!(
        "[{}]",
        reserved
            .iter()
            .map(|r| format!("'{r}'"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}
