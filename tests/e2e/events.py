"""The events of the end-to-end run, produced with the CloudEvents SDK.

Every `*.json` payload of a cases folder becomes one event: type and stream
follow the folder's README (the same rules as scripts/quickstart.py, which
this module reuses), the data is the file's bytes, `application/json`.  On a
few streams the sequence A -> B -> A of two of that stream's payloads is added
as three more events (new ids each time).

The SDK builds each event (it validates the attributes and fills in
`specversion` and `time`) and writes it in the structured JSON format.  The
SDK's JSON format would re-encode `data` (escaping non-ASCII, changing the
spacing), so the payload file's own bytes are put in as the `data` member
instead: outboxd must keep them byte for byte.
"""

import hashlib
import json
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from cloudevents.core.bindings import http as ce_http
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import quickstart  # noqa: E402  (stream_of / type_of: the cases README's rules)

JSON_FORMAT = JSONFormat()


class CasesError(Exception):
    pass


@dataclass
class Event:
    id: str
    stream: str
    type: str
    source: str
    subject: str
    time: object  # datetime, as the SDK set it
    raw: bytes  # the payload file's bytes
    payload: object  # the same, parsed
    body: bytes  # the structured-mode request body
    content_type: str  # the request's Content-Type
    label: str
    sha256: str = field(init=False)
    sequence: int | None = None  # as outboxd answered at ingest

    def __post_init__(self):
        self.sha256 = hashlib.sha256(self.data).hexdigest()

    @property
    def data(self):
        """The data as outboxd must deliver it: the JSON text of the file, i.e.
        its bytes without the whitespace around the value (a trailing newline
        of the file is JSON whitespace in the structured event, not data)."""
        return self.raw.strip(b" \t\r\n")


def make_event(raw, payload, stream, etype, subject, label):
    attributes = {
        "id": str(uuid.uuid4()),
        "source": f"https://github.com/{stream}",
        "type": f"com.github.{etype}",
        "subject": subject,
        "datacontenttype": "application/json",
        "partitionkey": stream,
    }
    event = CloudEvent(attributes)  # no data yet: see the module note
    message = ce_http.to_structured(event, JSON_FORMAT)
    envelope = message.body
    if not envelope.endswith(b"}") or {"data", "data_base64"} & json.loads(envelope).keys():
        raise CasesError(f"{label}: unexpected structured envelope {envelope[:200]!r}")
    body = envelope[:-1] + b', "data": ' + raw + b"}"
    # The SDK must read back what is sent: same attributes, same data.
    back = ce_http.from_structured(ce_http.HTTPMessage(headers=message.headers, body=body), JSON_FORMAT)
    if back.get_id() != attributes["id"] or back.get_data() != payload:
        raise CasesError(f"{label}: the SDK does not read back the event it wrote")
    attrs = event.get_attributes()
    return Event(
        id=attrs["id"], stream=stream, type=attrs["type"], source=attrs["source"],
        subject=subject, time=attrs["time"], raw=raw, payload=payload, body=body,
        content_type=message.headers["content-type"], label=label)


def load_cases(cases_dir):
    """[(rel path, raw bytes, payload, stream, type)] for every *.json, sorted."""
    cases = []
    for path in sorted(p for p in Path(cases_dir).rglob("*.json") if p.is_file()):
        rel = path.relative_to(cases_dir)
        raw = path.read_bytes()
        if raw.startswith(b"\xef\xbb\xbf"):
            raise CasesError(f"{path}: starts with a byte order mark")
        try:
            payload = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise CasesError(f"{path}: not UTF-8 JSON: {exc}") from None
        cases.append((rel, raw, payload, quickstart.stream_of(payload), quickstart.type_of(rel, payload)))
    if not cases:
        raise CasesError(f"no *.json files under {cases_dir}")
    return cases


def build(cases_dir, aba_streams=3):
    """Return (events per stream in send order, [(stream, [idA1, idB, idA2])])."""
    per_stream = {}
    for rel, raw, payload, stream, etype in load_cases(cases_dir):
        ev = make_event(raw, payload, stream, etype, rel.as_posix(), rel.as_posix())
        per_stream.setdefault(stream, []).append(ev)

    # A -> B -> A on the streams with the most payloads that hold two different ones.
    candidates = sorted(per_stream, key=lambda s: (-len(per_stream[s]), s))
    abas = []
    for stream in candidates:
        if len(abas) == aba_streams:
            break
        evs = per_stream[stream]
        a = evs[0]
        b = next((e for e in evs[1:] if e.raw != a.raw), None)
        if b is None:
            continue
        triple = []
        for tag, src in (("A", a), ("B", b), ("A", a)):
            ev = make_event(src.raw, src.payload, stream, src.type[len("com.github."):], src.subject,
                            f"A->B->A on {stream}: {tag} ({src.subject})")
            triple.append(ev)
        per_stream[stream].extend(triple)
        abas.append((stream, [e.id for e in triple]))
    return per_stream, abas
