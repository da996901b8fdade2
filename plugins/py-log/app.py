"""py-log: an outboxd sink written in Python.

Writes each event to the daemon's log as one JSON line (id, stream,
sequence, type, and the data when it is JSON), through the host's `log`
interface. With `strict = "true"` (the default) an event whose content type
says JSON but whose data does not parse is rejected, so it is dead-lettered
with the parser's message instead of logged as garbage.

Built into a WebAssembly component by componentize-py (pinned in
requirements.txt; see scripts/build-py-plugins.sh); the WIT contract is
../../wit/sink.wit. The host instantiates the component afresh for every
batch, so the module-level state below lasts one batch.
"""

import json
from typing import List, Tuple

import wit_world
from componentize_py_types import Err
from wit_world.imports import log, types

strict = True


def is_json(content_type):
    essence = (content_type or "application/json").split(";")[0].strip().lower()
    return essence == "application/json" or essence.endswith("+json")


class WitWorld(wit_world.WitWorld):
    def init(self, config: List[Tuple[str, str]]) -> None:
        """`config` is the manifest's [config] table as (key, value) strings,
        in no set order. Raising `Err(reason)` refuses it (the daemon fails
        the batch with `plugin init failed: <reason>`)."""
        global strict
        strict = True
        for key, value in config:
            if key != "strict":
                raise Err(f"unknown config key `{key}` (known: strict)")
            if value not in ("true", "false"):
                raise Err("config key `strict` must be true or false")
            strict = value == "true"

    def deliver(self, batch: List[types.Event]) -> List[types.Outcome]:
        """One outcome per event, in order. Logging cannot fail transiently,
        so this sink never retries; a rejected event does not stop the rest
        of the batch."""
        outcomes: List[types.Outcome] = []
        for event in batch:
            line = {
                "id": event.id,
                "stream": event.stream,
                "sequence": str(event.sequence),
                "type": event.type,
                "attempt": event.attempt,
            }
            if is_json(event.datacontenttype):
                try:
                    line["data"] = json.loads(event.data.decode("utf-8"))
                except (UnicodeDecodeError, ValueError) as e:
                    if strict:
                        outcomes.append(types.Outcome_Reject(f"data is not valid JSON: {e}"))
                        continue
                    line["data_bytes"] = len(event.data)
            else:
                line["data_bytes"] = len(event.data)
            log.log(log.Level.INFO, json.dumps(line, separators=(",", ":")))
            outcomes.append(types.Outcome_Delivered())
        return outcomes
