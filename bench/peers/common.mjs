// Shared by the Node.js peers: the job set and the POST to the receiver.
//
// Every peer enqueues the same N jobs as outboxd gets events (job k on
// stream `s{k % S}`, position k / S + 1 in its stream, 256 bytes of JSON
// data) and its handler POSTs each to the receiver with the headers the
// webhook sink sends (ce-id, ce-partitionkey, ce-sequence), so the receiver
// counts, de-duplicates and checks order the same way for everyone.

export const cfg = {
  db: process.env.BENCH_DATABASE_URL,
  receiver: process.env.BENCH_RECEIVER ?? 'http://127.0.0.1:9390',
  n: Number(process.env.BENCH_N ?? 10000),
  streams: Number(process.env.BENCH_STREAMS ?? 100),
  ordered: process.env.BENCH_MODE === 'ordered',
  runId: process.env.BENCH_RUN_ID ?? 'peer',
};

export function nowNs() {
  return Math.round((performance.timeOrigin + performance.now()) * 1e6);
}

export function say(event, extra = {}) {
  process.stdout.write(JSON.stringify({ event, ns: nowNs(), ...extra }) + '\n');
}

function payload(k) {
  const head = `{"k":${k},"pad":""}`;
  return { k, pad: 'x'.repeat(256 - head.length) };
}

export function job(k) {
  return {
    id: `${cfg.runId}-${k}`,
    stream: `s${k % cfg.streams}`,
    seq: Math.floor(k / cfg.streams) + 1,
    data: payload(k),
  };
}

export async function post(j) {
  for (let attempt = 1; ; attempt++) {
    try {
      const r = await fetch(`${cfg.receiver}/webhook`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'ce-id': j.id,
          'ce-partitionkey': j.stream,
          'ce-sequence': String(j.seq),
        },
        body: JSON.stringify(j.data),
      });
      await r.arrayBuffer();
      if (r.ok) return;
      throw new Error(`HTTP ${r.status}`);
    } catch (e) {
      if (attempt >= 5) throw e;
      await new Promise((res) => setTimeout(res, 50));
    }
  }
}

/** Batches of `size` jobs, in order. */
export function* batches(size) {
  for (let start = 0; start < cfg.n; start += size) {
    const out = [];
    for (let k = start; k < Math.min(cfg.n, start + size); k++) out.push(job(k));
    yield out;
  }
}
