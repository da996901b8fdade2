// Debezium Engine peer for the benchmark's debezium stage (bench/debezium.py).
// Owns: reading the `outbox` table of one PostgreSQL database through pgoutput,
// routing each row with the outbox EventRouter SMT, and POSTing it to the
// benchmark receiver with ce-id / ce-partitionkey / ce-sequence headers.
// Must never commit an offset before the receiver answered 2xx, and never
// reorder events of one aggregate (one sender, commit order).
package outboxbench;

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.Json;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

public final class DebeziumPeer {

    /** Arguments: host port db user receiverUrl offsetsFile slotName. */
    public static void main(String[] args) throws Exception {
        if (args.length < 7) {
            System.err.println("usage: DebeziumPeer host port db user receiverUrl offsetsFile slot");
            System.exit(2);
        }
        String url = args[4].endsWith("/") ? args[4] + "debezium" : args[4] + "/debezium";
        Properties p = new Properties();
        p.setProperty("name", "outbox-bench");
        p.setProperty("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
        p.setProperty("offset.storage", "org.apache.kafka.connect.storage.FileOffsetBackingStore");
        p.setProperty("offset.storage.file.filename", args[5]);
        p.setProperty("offset.flush.interval.ms", "0");
        p.setProperty("database.hostname", args[0]);
        p.setProperty("database.port", args[1]);
        p.setProperty("database.dbname", args[2]);
        p.setProperty("database.user", args[3]);
        p.setProperty("database.password", "");
        p.setProperty("topic.prefix", "bench");
        p.setProperty("plugin.name", "pgoutput");
        p.setProperty("slot.name", args[6]);
        p.setProperty("publication.autocreate.mode", "filtered");
        p.setProperty("table.include.list", "public.outbox");
        p.setProperty("snapshot.mode", "no_data");
        p.setProperty("tombstones.on.delete", "false");
        p.setProperty("max.batch.size", "2048");
        p.setProperty("max.queue.size", "8192");
        p.setProperty("poll.interval.ms", "1");
        p.setProperty("key.converter.schemas.enable", "false");
        p.setProperty("value.converter.schemas.enable", "false");
        p.setProperty("header.converter.schemas.enable", "false");
        p.setProperty("transforms", "outbox");
        p.setProperty("transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter");
        p.setProperty("transforms.outbox.table.expand.json.payload", "false");
        // The sequence column travels as a record header next to the id.
        p.setProperty("transforms.outbox.table.fields.additional.placement", "seq:header:seq");

        HttpClient http = HttpClient.newBuilder()
                .version(HttpClient.Version.HTTP_1_1)
                .connectTimeout(Duration.ofSeconds(10))
                .build();

        DebeziumEngine.ChangeConsumer<ChangeEvent<String, String>> consumer = (records, committer) -> {
            for (ChangeEvent<String, String> r : records) {
                String id = header(r, "id");
                String seq = header(r, "seq");
                String key = unquote(r.key());
                HttpRequest req = HttpRequest.newBuilder(URI.create(url))
                        .timeout(Duration.ofSeconds(30))
                        .header("content-type", "application/json")
                        .header("ce-specversion", "1.0")
                        .header("ce-id", id == null ? "" : id)
                        .header("ce-partitionkey", key == null ? "" : key)
                        .header("ce-sequence", seq == null ? "" : seq)
                        .header("ce-type", "outbox")
                        .header("ce-source", "debezium")
                        .POST(HttpRequest.BodyPublishers.ofString(r.value() == null ? "" : r.value()))
                        .build();
                postUntil2xx(http, req);
                committer.markProcessed(r);
            }
            committer.markBatchFinished();
        };

        DebeziumEngine<ChangeEvent<String, String>> engine = DebeziumEngine.create(Json.class, Json.class, Json.class)
                .using(p)
                .notifying(consumer)
                .using((success, message, error) -> {
                    // The engine stopped (or never started): end the process so
                    // the stage sees it instead of waiting on a silent JVM.
                    System.err.println("engine stopped: " + success + " " + message);
                    if (error != null) {
                        error.printStackTrace();
                    }
                    Runtime.getRuntime().halt(success ? 0 : 1);
                })
                .build();
        ExecutorService ex = Executors.newSingleThreadExecutor();
        ex.execute(engine);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                engine.close();
                ex.shutdown();
                ex.awaitTermination(10, TimeUnit.SECONDS);
            } catch (Exception e) {
                // shutting down anyway
            }
        }));
        System.err.println("debezium peer started, posting to " + url);
        ex.awaitTermination(Long.MAX_VALUE, TimeUnit.DAYS);
    }

    /** Retries with a short back-off until the receiver answers 2xx. */
    private static void postUntil2xx(HttpClient http, HttpRequest req) throws InterruptedException {
        long backoff = 10;
        while (true) {
            try {
                HttpResponse<Void> resp = http.send(req, HttpResponse.BodyHandlers.discarding());
                if (resp.statusCode() / 100 == 2) {
                    return;
                }
            } catch (java.io.IOException e) {
                // retried below
            }
            Thread.sleep(backoff);
            backoff = Math.min(backoff * 2, 1000);
        }
    }

    /** A record header's value as text (the EventRouter puts the row id in "id"). */
    private static String header(ChangeEvent<String, String> r, String name) {
        List<io.debezium.engine.Header<?>> hs = castHeaders(r.headers());
        for (io.debezium.engine.Header<?> h : hs) {
            if (h.getKey().equals(name)) {
                return unquote(String.valueOf(h.getValue()));
            }
        }
        return null;
    }

    @SuppressWarnings("unchecked")
    private static List<io.debezium.engine.Header<?>> castHeaders(List<?> hs) {
        return (List<io.debezium.engine.Header<?>>) hs;
    }

    private static String unquote(String s) {
        if (s == null) {
            return null;
        }
        s = s.trim();
        if (s.length() >= 2 && s.startsWith("\"") && s.endsWith("\"")) {
            return s.substring(1, s.length() - 1);
        }
        return s;
    }
}
