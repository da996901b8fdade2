package outboxd.testing;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;

import org.neo4j.configuration.GraphDatabaseSettings;
import org.neo4j.configuration.connectors.BoltConnector;
import org.neo4j.configuration.helpers.SocketAddress;
import org.neo4j.dbms.api.DatabaseManagementService;
import org.neo4j.dbms.api.DatabaseManagementServiceBuilder;
import org.neo4j.graphdb.ExecutionPlanDescription;
import org.neo4j.graphdb.GraphDatabaseService;
import org.neo4j.graphdb.Result;
import org.neo4j.graphdb.Transaction;

/**
 * A real Neo4j for outboxd's tests: an embedded DatabaseManagementService
 * whose Bolt connector listens on 127.0.0.1:PORT, without encryption or
 * authentication, with a small page cache.
 *
 * <p>Usage: {@code java <Neo4j's JVM flags> -cp classes:lib/* outboxd.testing.EmbeddedNeo4j HOME PORT [PAGECACHE_MB]}.
 * Prints {@code NEO4J READY bolt://127.0.0.1:PORT} on stdout once the
 * default database is available, then runs until it is killed or its
 * standard input closes (so a test process that dies, even by SIGKILL,
 * takes its Neo4j with it).
 *
 * <p>One command is read from standard input, for tests that check query
 * plans (the Bolt driver does not expose them): a line
 * {@code EXPLAIN <base64 of a Cypher query>} is answered with
 * {@code PLAN <operator>;<operator>;...} (every operator of the plan tree,
 * depth first) or {@code PLAN-ERROR <message>}.
 *
 * <p>It serves tests only: production uses a real Neo4j 5.x server.
 */
public final class EmbeddedNeo4j {
    private EmbeddedNeo4j() {}

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: EmbeddedNeo4j HOME PORT [PAGECACHE_MB]");
            System.exit(2);
        }
        Path home = Path.of(args[0]);
        int port = Integer.parseInt(args[1]);
        long pageCacheMb = args.length > 2 ? Long.parseLong(args[2]) : 64;

        DatabaseManagementService dbms = new DatabaseManagementServiceBuilder(home)
                .setConfig(BoltConnector.enabled, true)
                .setConfig(BoltConnector.listen_address, new SocketAddress("127.0.0.1", port))
                .setConfig(BoltConnector.encryption_level, BoltConnector.EncryptionLevel.DISABLED)
                .setConfig(GraphDatabaseSettings.auth_enabled, false)
                .setConfig(GraphDatabaseSettings.pagecache_memory, pageCacheMb * 1024 * 1024)
                .setConfig(GraphDatabaseSettings.preallocate_logical_logs, false)
                .setConfig(GraphDatabaseSettings.keep_logical_logs, "false")
                .setConfig(GraphDatabaseSettings.transaction_timeout, Duration.ofSeconds(120))
                .build();
        Runtime.getRuntime().addShutdownHook(new Thread(dbms::shutdown, "neo4j-shutdown"));

        if (!dbms.database(GraphDatabaseSettings.DEFAULT_DATABASE_NAME).isAvailable(120_000)) {
            System.err.println("the default database did not become available within 120 s");
            System.exit(1);
        }
        System.out.println("NEO4J READY bolt://127.0.0.1:" + port);
        System.out.flush();

        // Run until standard input closes (the parent went away) or we are killed.
        GraphDatabaseService db = dbms.database(GraphDatabaseSettings.DEFAULT_DATABASE_NAME);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.startsWith("EXPLAIN ")) {
                    String query = new String(Base64.getDecoder().decode(line.substring(8).trim()), StandardCharsets.UTF_8);
                    System.out.println(explain(db, query));
                    System.out.flush();
                }
            }
        } catch (IOException e) {
            // treat like end of input
        }
        System.exit(0);
    }

    private static String explain(GraphDatabaseService db, String query) {
        try (Transaction tx = db.beginTx()) {
            Result result = tx.execute("EXPLAIN " + query);
            List<String> ops = new ArrayList<>();
            collect(result.getExecutionPlanDescription(), ops);
            result.close();
            return "PLAN " + String.join(";", ops);
        } catch (RuntimeException e) {
            return "PLAN-ERROR " + String.valueOf(e.getMessage()).replace('\n', ' ');
        }
    }

    private static void collect(ExecutionPlanDescription plan, List<String> ops) {
        ops.add(plan.getName());
        for (ExecutionPlanDescription child : plan.getChildren()) {
            collect(child, ops);
        }
    }
}
