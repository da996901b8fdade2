"""pgqueuer peer: the same N jobs, each POSTed to the receiver.

pgqueuer has no per-key ordering (its `concurrency_limit` serialises a whole
entrypoint), so it runs in the standard mode only: batches of 100 dequeued,
handlers run concurrently.
"""

import asyncio
import json
import os
import time
from datetime import timedelta

import aiohttp
import asyncpg
from pgqueuer import AsyncpgDriver, QueueManager, Queries

DB = os.environ["BENCH_DATABASE_URL"]
RECEIVER = os.environ.get("BENCH_RECEIVER", "http://127.0.0.1:9390")
N = int(os.environ.get("BENCH_N", "10000"))
STREAMS = int(os.environ.get("BENCH_STREAMS", "100"))
RUN_ID = os.environ.get("BENCH_RUN_ID", "peer")


def say(event, **extra):
    print(json.dumps({"event": event, "ns": time.time_ns(), **extra}), flush=True)


def job(k):
    head = f'{{"k":{k},"pad":""}}'
    return {
        "id": f"{RUN_ID}-{k}",
        "stream": f"s{k % STREAMS}",
        "seq": k // STREAMS + 1,
        "data": {"k": k, "pad": "x" * (256 - len(head))},
    }


async def main():
    admin = await asyncpg.connect(DB)
    await Queries(AsyncpgDriver(admin)).install()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
    qm = QueueManager(Queries(AsyncpgDriver(await asyncpg.connect(DB))))

    @qm.entrypoint("deliver")
    async def deliver(j):
        p = json.loads(j.payload)
        headers = {"ce-id": p["id"], "ce-partitionkey": p["stream"], "ce-sequence": str(p["seq"])}
        for attempt in range(5):
            try:
                async with session.post(f"{RECEIVER}/webhook", json=p["data"], headers=headers) as r:
                    await r.read()
                    if r.status < 300:
                        return
            except aiohttp.ClientError:
                if attempt == 4:
                    raise
            await asyncio.sleep(0.05)

    say("ready")
    worker = asyncio.create_task(qm.run(batch_size=100, dequeue_timeout=timedelta(seconds=1)))
    await asyncio.sleep(0.2)
    enq = Queries(AsyncpgDriver(await asyncpg.connect(DB)))
    say("enqueue_start")
    for start in range(0, N, 100):
        ks = range(start, min(N, start + 100))
        await enq.enqueue(["deliver"] * len(ks), [json.dumps(job(k)).encode() for k in ks], [0] * len(ks))
    say("enqueue_end")
    await worker


asyncio.run(main())
