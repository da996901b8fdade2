// pg-boss peer. Mode `standard`: a standard queue, batches of 100 fetched
// and POSTed concurrently. Mode `ordered`: the `key_strict_fifo` policy with
// the stream as `singletonKey` (FIFO per key), each key's jobs of a batch
// POSTed one after another.
import { PgBoss } from 'pg-boss';
import { cfg, say, batches, post } from './common.mjs';

const queue = cfg.ordered ? 'bench_fifo' : 'bench';
const boss = new PgBoss({ connectionString: cfg.db, max: 10, schedule: false, supervise: true, useListenNotify: true });
boss.on('error', (e) => console.error('pg-boss error:', e.message));
await boss.start();
await boss.createQueue(queue, { policy: cfg.ordered ? 'key_strict_fifo' : 'standard', notify: true });
say('ready');

await boss.work(
  queue,
  { batchSize: 100, localConcurrency: 2, pollingIntervalSeconds: 0.5, notifyPollingIntervalSeconds: 0.5, burstWhenBatchFull: true },
  async (jobs) => {
    // Per stream, one after another; streams concurrently.
    const byStream = new Map();
    for (const j of jobs) {
      const s = j.data.stream;
      if (!byStream.has(s)) byStream.set(s, []);
      byStream.get(s).push(j.data);
    }
    await Promise.all([...byStream.values()].map(async (list) => {
      if (!cfg.ordered) return Promise.all(list.map(post));
      for (const j of list) await post(j);
    }));
  },
);

say('enqueue_start');
for (const b of batches(100)) {
  await boss.insert(queue, b.map((j) => ({ data: j, singletonKey: cfg.ordered ? j.stream : undefined })));
}
say('enqueue_end');
// Runs until the harness stops it.
