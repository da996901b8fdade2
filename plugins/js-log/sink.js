// js-log: an outboxd sink written in JavaScript.
//
// Writes each event to the daemon's log as one JSON line (id, stream,
// sequence, type, and the data when it is JSON), through the host's `log`
// interface. With `strict = "true"` (the default) an event whose content
// type says JSON but whose data does not parse is rejected, so it is
// dead-lettered with the parser's message instead of logged as garbage.
//
// Built into a WebAssembly component by componentize-js (see package.json
// and scripts/build-js-plugins.sh); the WIT contract is ../../wit/sink.wit.

import { log } from 'outboxd:sink/log@0.1.5';

let strict = true;

// `config` is the manifest's [config] table as [key, value] pairs. A thrown
// string refuses the configuration (the host reports it as `plugin init
// failed: ...` and retries the batch).
export function init(config) {
  strict = true;
  for (const [key, value] of config) {
    if (key !== 'strict') {
      throw `unknown config key \`${key}\` (known: strict)`;
    }
    if (value !== 'true' && value !== 'false') {
      throw `config key \`strict\` must be true or false, got \`${value}\``;
    }
    strict = value === 'true';
  }
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

function isJson(contentType) {
  const type = (contentType ?? 'application/json').split(';')[0].trim().toLowerCase();
  return type === 'application/json' || type.endsWith('+json');
}

// One outcome per event, in order: `{ tag: 'delivered' }`,
// `{ tag: 'reject', val: reason }` or
// `{ tag: 'retry', val: { reason, afterMs } }`. Logging cannot fail
// transiently, so this sink never retries, and a rejection does not stop
// the rest of the batch: a rejected event is dead-lettered, not retried.
export function deliver(batch) {
  return batch.map((event) => {
    const line = {
      id: event.id,
      stream: event.stream,
      sequence: String(event.sequence),
      type: event.type,
      attempt: event.attempt,
    };
    if (isJson(event.datacontenttype)) {
      try {
        line.data = JSON.parse(utf8.decode(event.data));
      } catch (e) {
        if (strict) {
          return { tag: 'reject', val: `data is not valid JSON: ${e.message ?? e}` };
        }
        line.data_bytes = event.data.length;
      }
    } else {
      line.data_bytes = event.data.length;
    }
    log('info', JSON.stringify(line));
    return { tag: 'delivered' };
  });
}
