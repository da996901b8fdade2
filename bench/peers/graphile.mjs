// graphile-worker peer. Mode `standard`: jobs without a queue, 32 at once.
// Mode `ordered`: each job in the named queue of its stream (`queueName`),
// which graphile-worker runs serially.
import { run, makeWorkerUtils, Logger } from 'graphile-worker';
import { cfg, say, batches, post } from './common.mjs';

// Errors only: the default logger prints a line per job.
const logger = new Logger(() => (level, message) => { if (level === 'error') console.error(message); });
const utils = await makeWorkerUtils({ connectionString: cfg.db, logger });
await utils.migrate();
const runner = await run({
  connectionString: cfg.db,
  concurrency: 32,
  maxPoolSize: 34,
  pollInterval: 500,
  noHandleSignals: true,
  logger,
  preset: { worker: { localQueue: { size: 100 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
  taskList: { deliver: async (payload) => post(payload) },
});
say('ready');

say('enqueue_start');
for (const b of batches(100)) {
  await utils.addJobs(b.map((j) => ({ identifier: 'deliver', payload: j, queueName: cfg.ordered ? j.stream : undefined })));
}
say('enqueue_end');
await runner.promise;
