"""outboxd as a child process: start, wait until ready, SIGKILL, restart; its
PostgreSQL database (through psql) and its /metrics."""

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

# Talk to 127.0.0.1 directly, whatever proxy the environment names.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(method, url, body=None, content_type=None, timeout=15):
    """(status, body bytes); error statuses are returned, connection errors raised."""
    headers = {"Content-Type": content_type} if content_type else {}
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with _HTTP.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Psql:
    """psql against one database; `query` returns rows of `|`-separated fields."""

    def __init__(self, url):
        self.url = url

    def query(self, sql, timeout=30):
        out = subprocess.run(
            ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", self.url, "-c", sql],
            capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"psql: {sql[:80]}: {out.stderr.strip()}")
        return [line.split("|") for line in out.stdout.splitlines() if line]


class Freeze:
    """Holds SHARE locks on outboxd.events and outboxd.deliveries in an open
    transaction: outboxd can read but commit no ingest, claim or finish until
    the transaction ends. Used to take an exact /metrics scrape right before a
    SIGKILL (see real_input.py)."""

    def __init__(self, url, timeout=5.0):
        self.proc = subprocess.Popen(
            ["psql", "-X", "-q", "-A", "-t", url], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ms = int(timeout * 1000)
        self.proc.stdin.write(
            f"SET lock_timeout = '{ms}ms';\nBEGIN;\n"
            "LOCK TABLE outboxd.events, outboxd.deliveries IN SHARE MODE;\n"
            "SELECT 'frozen';\n")
        self.proc.stdin.flush()
        self.ok = False
        self.error = None
        deadline = time.monotonic() + timeout + 2
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic())).strip()
            except queue.Empty:
                break
            if line == "frozen":
                self.ok = True
                return
            if line:
                self.error = line
                break
        self.error = self.error or "no lock within the timeout"

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    def release(self):
        try:
            self.proc.stdin.write("ROLLBACK;\n\\q\n")
            self.proc.stdin.flush()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """{(name, frozenset(labels)): value} of a Prometheus/OpenMetrics text."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = METRIC_LINE.match(line)
        if not m:
            continue
        labels = frozenset(LABEL.findall(m.group(2) or ""))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def metric(samples, name, **labels):
    want = frozenset(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


class Daemon:
    """One outboxd at a time on a fixed port, restartable."""

    def __init__(self, binary, env, port, log_dir):
        self.binary = binary
        self.env = env
        self.port = port
        self.api = f"http://127.0.0.1:{port}"
        self.log_dir = log_dir
        self.proc = None
        self.incarnation = 0
        self.log_path = None

    def start(self, timeout=60):
        self.incarnation += 1
        self.log_path = self.log_dir / f"outboxd.{self.incarnation}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), "run", "--migrate"], env=self.env, cwd=self.log_dir,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"outboxd exited with {self.proc.returncode} at start; see {self.log_path}")
            try:
                status, body = http("GET", f"{self.api}/ready", timeout=3)
                if status == 200 and json.loads(body).get("ready"):
                    return
            except (OSError, ValueError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"outboxd not ready within {timeout}s; see {self.log_path}")

    def scrape(self):
        status, body = http("GET", f"{self.api}/metrics", timeout=10)
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        return parse_metrics(body.decode())

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout=45):
        """SIGTERM and wait; returns the exit status (None if it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env():
    """The environment without any OUTBOXD_* setting of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXD_")}
    for var in ("NO_PROXY", "no_proxy"):
        env[var] = ",".join(filter(None, [env.get(var), "127.0.0.1", "localhost"]))
    return env


def sinks_env(db_url, work, port, lease_ms, webhook_url, secret, amqp_url, exchange):
    """The environment of an outboxd with the webhook and amqp sinks of the
    plugins folder `work`/plugins, on PostgreSQL `db_url`, listening on
    127.0.0.1:`port`; any OUTBOXD_* setting of the caller's left out."""
    env = clean_env()
    env.update({
        "OUTBOXD_DATABASE_URL": db_url,
        "OUTBOXD_PLUGINS_DIR": str(work / "plugins"),
        "OUTBOXD_DATA_DIR": str(work / "data"),
        "OUTBOXD_LISTEN": f"127.0.0.1:{port}",
        "OUTBOXD_DELIVERY__LEASE": f"{lease_ms}ms",
        "OUTBOXD_WEBHOOK_URL": f"{webhook_url}/webhook",
        "OUTBOXD_WEBHOOK_ALLOW": webhook_url,
        "OUTBOXD_WEBHOOK_SECRET": secret,
        "OUTBOXD_AMQP_URL": amqp_url,
        "OUTBOXD_AMQP_EXCHANGE": exchange,
    })
    return env
