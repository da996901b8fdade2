// A vault's side of the awareness outbox, for the takeover tests: the
// outbox write a vault makes in the transaction of each mutation, and the
// dispatcher that drains it, both written from the vault's published
// protocol with the official JavaScript driver, so that every property has
// the type the vault's own code gives it (Date.now() is stored as a FLOAT,
// `attempts: 0` as an INTEGER, the time as ISO text).
//
//   node vault.mjs write    --url U --label L --packets P --per-packet K [--prefix X] [--pause-ms N]
//   node vault.mjs dispatch --url U --label L --target BASE --secret S [--worker W]
//                           [--lease-ms N] [--poll-ms N] [--batch N] [--retry-ms a,b,c] [--hold]
//
// The protocol (the vault's awareness outbox dispatcher):
// - statuses pending | delivering | failed | delivered; no dead state;
// - candidates in two lanes: due (pending or failed, nextAttemptAt <= now)
//   and expired (delivering, leaseExpiresAt <= now), keyset-paged;
// - a candidate is taken only when no earlier streamVersion of its packet
//   is pending, failed or delivering;
// - the lease writes `claimProbe` first (taking the node's write lock),
//   then re-checks, then sets delivering, leaseOwner, leaseToken and
//   leaseExpiresAt = now + lease;
// - POST {target}/ingest with the awareness body and x-ingest-secret;
// - the finish matches {eventId, leaseToken}: delivered (acknowledgedAt)
//   or failed (nextAttemptAt from the retry schedule), attempts + 1, the
//   lease properties set to null;
// - delivered nodes are deleted 7 days after acknowledgedAt.
//
// `--hold` leases one batch and exits without delivering it: a dispatcher
// stopped while holding leases. SIGTERM stops after the current cycle.

import { randomUUID } from "node:crypto";
import neo4j from "neo4j-driver";

const args = process.argv.slice(2);
const command = args[0];
function opt(name, fallback) {
    const i = args.indexOf(`--${name}`);
    if (i < 0) return fallback;
    return args[i + 1];
}
const flag = (name) => args.includes(`--${name}`);

const url = opt("url", "bolt://127.0.0.1:7687");
const label = opt("label", "AwarenessOutbox");
// The vault's counter label; per outbox label apart from the vault's own,
// so that outboxes side by side in one database count their streams apart.
const streamLabel = opt(
    "stream-label",
    label === "AwarenessOutbox" ? "AwarenessStream" : `${label}Stream`,
);
const driver = neo4j.driver(url, neo4j.auth.basic("neo4j", ""), {
    disableLosslessIntegers: true,
});

const num = (v) => (typeof v?.toNumber === "function" ? v.toNumber() : Number(v));

async function write() {
    const packets = Number(opt("packets", "10"));
    const perPacket = Number(opt("per-packet", "10"));
    const prefix = opt("prefix", "");
    const pauseMs = Number(opt("pause-ms", "0"));
    const writeOne = async (p, k) => {
        const packetId = `${prefix}packet-${String(p).padStart(4, "0")}`;
        const session = driver.session();
        try {
            await session.executeWrite((tx) =>
                tx.run(
                    `MERGE (m:\`${label}Envelope\` { id: $packetId }) SET m.k = $k
                     WITH m
                     MERGE (s:\`${streamLabel}\` { packetId: $packetId })
                     SET s.version = coalesce(s.version, 0) + 1
                     CREATE (a:\`${label}\` {
                         eventId: $eventId,
                         packetId: $packetId,
                         schemaId: $schemaId,
                         w3id: $w3id,
                         evaultPublicKey: $evaultPublicKey,
                         dataJson: $dataJson,
                         operation: $operation,
                         requestingPlatform: $requestingPlatform,
                         occurredAt: $occurredAt,
                         streamVersion: s.version,
                         status: 'pending',
                         attempts: 0,
                         nextAttemptAt: $now,
                         createdAt: $now
                     })`,
                    {
                        packetId,
                        k,
                        eventId: `${packetId}-${String(k).padStart(5, "0")}`,
                        schemaId: "550e8400-e29b-41d4-a716-446655440000",
                        w3id: `@user-${p}`,
                        evaultPublicKey: p % 2 === 0 ? "z6Mk-vault-key" : null,
                        dataJson: JSON.stringify({ packet: packetId, k }),
                        operation: k === 0 ? "create" : "update",
                        requestingPlatform: k % 3 === 0 ? null : "platform-a",
                        occurredAt: new Date().toISOString(),
                        now: Date.now(),
                    },
                ),
            );
        } finally {
            await session.close();
        }
    };
    // Per packet one mutation after another (as one envelope is edited);
    // packets side by side.
    await Promise.all(
        Array.from({ length: packets }, async (_, p) => {
            for (let k = 0; k < perPacket; k++) {
                await writeOne(p, k);
                if (pauseMs > 0) await new Promise((r) => setTimeout(r, pauseMs));
            }
        }),
    );
    console.log(JSON.stringify({ written: packets * perPacket }));
}

const ACTIVE_PREDECESSOR = `
    MATCH (earlier:\`${label}\`)
    WHERE earlier.packetId = a.packetId
      AND earlier.status IN ['pending', 'failed', 'delivering']
      AND earlier.streamVersion < a.streamVersion`;
const ELIGIBLE = `((a.status IN ['pending', 'failed'] AND a.nextAttemptAt <= $now)
                OR (a.status = 'delivering' AND a.leaseExpiresAt <= $now))`;

function laneQuery(lane) {
    const due = lane === "due";
    const status = due ? "a.status IN ['pending', 'failed']" : "a.status = 'delivering'";
    const key = due ? "a.nextAttemptAt" : "a.leaseExpiresAt";
    return `MATCH (a:\`${label}\`)
            WHERE ${status} AND ${key} >= $after AND ${key} <= $now
              AND NOT a.eventId IN $exclude
            RETURN a.eventId AS eventId, ${key} AS sortKey
            ORDER BY ${key}, a.eventId LIMIT $page`;
}

async function dispatch() {
    const target = opt("target");
    const secret = opt("secret", "");
    const worker = opt("worker", `vault-${process.pid}`);
    const leaseMs = Number(opt("lease-ms", "30000"));
    const pollMs = Number(opt("poll-ms", "1000"));
    const batch = Number(opt("batch", "50"));
    const page = Number(opt("page", "500"));
    const maxPages = Number(opt("max-pages", "10"));
    const retention = Number(opt("retention-ms", String(7 * 24 * 3600 * 1000)));
    const schedule = opt("retry-ms", "1000,5000,30000,60000,120000,300000,900000,3600000,21600000,86400000")
        .split(",")
        .map(Number);
    const hold = flag("hold");
    let stopping = false;
    process.on("SIGTERM", () => {
        stopping = true;
    });
    for (const statement of [
        `CREATE INDEX \`vault_${label}_due\` IF NOT EXISTS FOR (a:\`${label}\`) ON (a.nextAttemptAt)`,
        `CREATE INDEX \`vault_${label}_expired\` IF NOT EXISTS FOR (a:\`${label}\`) ON (a.leaseExpiresAt)`,
        `CREATE INDEX \`vault_${label}_event\` IF NOT EXISTS FOR (a:\`${label}\`) ON (a.eventId)`,
        `CREATE INDEX \`vault_${label}_stream\` IF NOT EXISTS FOR (a:\`${label}\`) ON (a.packetId, a.streamVersion)`,
        `CREATE INDEX \`vault_${label}_acknowledged\` IF NOT EXISTS FOR (a:\`${label}\`) ON (a.acknowledgedAt)`,
    ]) {
        // Another dispatcher starting at the same time may be creating it.
        await driver.executeQuery(statement).catch(() => {});
    }
    await driver.executeQuery("CALL db.awaitIndexes(60)");
    const stats = { delivered: 0, failed: 0, lost: 0 };

    const candidates = async (lanes, now) => {
        const pages = { expired: [], due: [] };
        for (const lane of ["expired", "due"]) {
            const c = lanes[lane];
            if (c.drained) continue;
            const { records } = await driver.executeQuery(
                laneQuery(lane),
                { now, after: c.after, exclude: c.exclude, page: neo4j.int(page) },
                { routing: neo4j.routing.READ },
            );
            const rows = records.map((r) => ({ eventId: r.get("eventId"), sortKey: num(r.get("sortKey")) }));
            if (rows.length < page) c.drained = true;
            const last = rows[rows.length - 1];
            if (last) {
                c.exclude =
                    last.sortKey === c.after
                        ? [...c.exclude, ...rows.map((r) => r.eventId)]
                        : rows.filter((r) => r.sortKey === last.sortKey).map((r) => r.eventId);
                c.after = last.sortKey;
            }
            pages[lane] = rows.map((r) => r.eventId);
        }
        const merged = [];
        for (let i = 0; i < Math.max(pages.expired.length, pages.due.length); i++) {
            if (i < pages.expired.length) merged.push(pages.expired[i]);
            if (i < pages.due.length) merged.push(pages.due[i]);
        }
        return merged;
    };

    const lease = async (eventIds, now, limit) => {
        const token = randomUUID();
        const { records: shortlist } = await driver.executeQuery(
            `UNWIND $eventIds AS eventId
             MATCH (a:\`${label}\` { eventId: eventId })
             WHERE ${ELIGIBLE} AND NOT EXISTS { ${ACTIVE_PREDECESSOR} }
             RETURN a.eventId AS eventId LIMIT $limit`,
            { eventIds, now, limit: neo4j.int(limit) },
            { routing: neo4j.routing.READ },
        );
        const ids = shortlist.map((r) => r.get("eventId"));
        if (ids.length === 0) return [];
        const { records } = await driver.executeQuery(
            `UNWIND $eventIds AS eventId
             MATCH (a:\`${label}\` { eventId: eventId })
             SET a.claimProbe = $token
             WITH a
             WHERE ${ELIGIBLE} AND NOT EXISTS { ${ACTIVE_PREDECESSOR} }
             SET a.status = 'delivering', a.leaseOwner = $worker,
                 a.leaseToken = $token, a.leaseExpiresAt = $expires
             RETURN a`,
            { eventIds: ids, now, worker, token, expires: Date.now() + leaseMs },
        );
        return records.map((r) => ({ ...r.get("a").properties, leaseToken: token }));
    };

    const finish = async (event, delivered, error) => {
        const attempts = num(event.attempts) + 1;
        const base = schedule[Math.min(attempts - 1, schedule.length - 1)];
        const jitter = base * (Math.random() * 0.2 - 0.1);
        const { summary } = await driver.executeQuery(
            `MATCH (a:\`${label}\` { eventId: $eventId, leaseToken: $leaseToken })
             SET a.status = $status, a.attempts = $attempts, a.lastError = $error,
                 a.nextAttemptAt = $next, a.acknowledgedAt = $acknowledgedAt,
                 a.leaseOwner = null, a.leaseToken = null, a.leaseExpiresAt = null`,
            {
                eventId: event.eventId,
                leaseToken: event.leaseToken,
                status: delivered ? "delivered" : "failed",
                attempts,
                error,
                next: delivered ? Date.now() : Date.now() + base + jitter,
                acknowledgedAt: delivered ? Date.now() : null,
            },
        );
        if (summary.counters.updates().propertiesSet === 0) stats.lost += 1;
        else if (delivered) stats.delivered += 1;
        else stats.failed += 1;
    };

    const deliver = async (event) => {
        const body = JSON.stringify({
            eventId: event.eventId,
            id: event.packetId,
            w3id: event.w3id,
            evaultPublicKey: event.evaultPublicKey ?? null,
            data: JSON.parse(event.dataJson),
            schemaId: event.schemaId,
            operation: event.operation,
            requestingPlatform: event.requestingPlatform ?? null,
            occurredAt: event.occurredAt,
            streamVersion: num(event.streamVersion),
        });
        let error = null;
        try {
            const res = await fetch(new URL("/ingest", target), {
                method: "POST",
                headers: { "content-type": "application/json", "x-ingest-secret": secret },
                body,
                signal: AbortSignal.timeout(5000),
            });
            if (!res.ok) error = `${res.status}: ${await res.text()}`;
        } catch (e) {
            error = `error: ${e?.message ?? String(e)}`;
        }
        await finish(event, error === null, error);
    };

    while (!stopping) {
        try {
            const now = Date.now();
            const lanes = {
                expired: { after: 0, exclude: [], drained: false },
                due: { after: 0, exclude: [], drained: false },
            };
            const claimed = [];
            for (let p = 0; p < maxPages && claimed.length < batch; p++) {
                const ids = await candidates(lanes, now);
                if (ids.length === 0) break;
                claimed.push(...(await lease(ids, now, batch - claimed.length)));
            }
            if (hold) {
                console.log(JSON.stringify({ held: claimed.map((e) => e.eventId) }));
                break;
            }
            await Promise.all(claimed.map(deliver));
            await driver.executeQuery(
                `MATCH (a:\`${label}\` { status: 'delivered' }) WHERE a.acknowledgedAt < $before
                 WITH a LIMIT 500 DELETE a`,
                { before: Date.now() - retention },
            );
        } catch (e) {
            console.error(`[vault ${worker}] dispatch cycle failed: ${e?.message ?? e}`);
        }
        await new Promise((r) => setTimeout(r, pollMs));
    }
    if (!hold) console.log(JSON.stringify(stats));
}

try {
    if (command === "write") await write();
    else if (command === "dispatch") await dispatch();
    else throw new Error(`unknown command ${command}: write | dispatch`);
} finally {
    await driver.close();
}
