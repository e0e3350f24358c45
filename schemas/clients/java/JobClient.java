// A client written from schemas/ and docs/wire-contract.md alone, in another language than the
// worker: it sends contract v2 jobs (moderation-job.v2.schema.json: a msgpack map, key = job id)
// and reads their results and DLQ records back with read_committed, checking that every answer
// sits on the partition Java's default partitioner picks for its key, and that every result is
// a v2 one (header ktw.schema = moderation-result/v2, v = 2, rule and models present, scores
// keyed <model>.<label>: moderation-result.v2.schema.json).
//
//   mvn -B -q -f schemas/clients/java/pom.xml dependency:copy-dependencies -DoutputDirectory=libs
//   java -cp "libs/*" schemas/clients/java/JobClient.java \
//        BOOTSTRAP JOBS_TOPIC RESULTS_TOPIC DLQ_TOPIC IMAGE_FILE COUNT [BAD_COUNT] [TIMEOUT_S]
//
// Prints one JSON line: sent, answered, per-status, per-reason and per-ktw.schema counts,
// misplaced answers and results not in v2's shape.

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.Utils;
import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;
import org.msgpack.value.Value;
import org.msgpack.value.ValueFactory;

public class JobClient {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], jobs = args[1], results = args[2], dlq = args[3];
        byte[] image = Files.readAllBytes(Path.of(args[4]));
        int count = Integer.parseInt(args[5]);
        int bad = args.length > 6 ? Integer.parseInt(args[6]) : 0;
        long timeoutMs = 1000L * (args.length > 7 ? Integer.parseInt(args[7]) : 120);
        String run = "java-" + Long.toHexString(System.nanoTime());
        Set<String> sent = new TreeSet<>();

        // Security settings (SASL_SSL, TLS stores) for both clients: a properties file named
        // by JOB_CLIENT_PROPERTIES, as a Java client deployment keeps them.
        Properties extra = new Properties();
        String extraPath = System.getenv("JOB_CLIENT_PROPERTIES");
        if (extraPath != null && !extraPath.isEmpty()) {
            try (var in = Files.newInputStream(Path.of(extraPath))) {
                extra.load(in);
            }
        }

        Properties p = new Properties();
        p.putAll(extra);
        p.put("bootstrap.servers", bootstrap);
        p.put("acks", "all");
        p.put("enable.idempotence", "true");
        try (KafkaProducer<String, byte[]> producer =
                 new KafkaProducer<>(p, new StringSerializer(), new ByteArraySerializer())) {
            for (int i = 0; i < count; i++) {
                String id = run + "-" + i;
                sent.add(id);
                producer.send(new ProducerRecord<>(jobs, id, job(id, image)));
            }
            for (int i = 0; i < bad; i++) {  // not msgpack: the DLQ answers these
                String id = run + "-bad-" + i;
                sent.add(id);
                producer.send(new ProducerRecord<>(jobs, id, new byte[] {(byte) 0xc1, 'x'}));
            }
            producer.flush();
        }

        Properties c = new Properties();
        c.putAll(extra);
        c.put("bootstrap.servers", bootstrap);
        c.put("group.id", run);
        c.put("auto.offset.reset", "earliest");
        c.put("enable.auto.commit", "false");
        c.put("isolation.level", "read_committed");  // exactly-once outputs: committed only
        Map<String, String> answered = new TreeMap<>();
        Map<String, Integer> statuses = new TreeMap<>(), reasons = new TreeMap<>();
        Map<String, Integer> schemas = new TreeMap<>();
        int misplaced = 0, notV2 = 0;
        try (KafkaConsumer<String, byte[]> consumer =
                 new KafkaConsumer<>(c, new StringDeserializer(), new ByteArrayDeserializer())) {
            int resultParts = consumer.partitionsFor(results).size();
            int dlqParts = consumer.partitionsFor(dlq).size();
            consumer.subscribe(List.of(results, dlq));
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (!answered.keySet().containsAll(sent) && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    if (r.key() == null || !sent.contains(r.key())) {
                        continue;
                    }
                    int parts = r.topic().equals(results) ? resultParts : dlqParts;
                    byte[] key = r.key().getBytes(StandardCharsets.UTF_8);
                    if (Utils.toPositive(Utils.murmur2(key)) % parts != r.partition()) {
                        misplaced++;
                    }
                    if (r.topic().equals(results)) {
                        Map<Value, Value> m = MessagePack.newDefaultUnpacker(r.value())
                            .unpackValue().asMapValue().map();
                        String status = m.get(ValueFactory.newString("status")).toString();
                        answered.put(r.key(), status);
                        statuses.merge(status, 1, Integer::sum);
                        Header schema = r.headers().lastHeader("ktw.schema");
                        schemas.merge(schema == null ? "?" : new String(
                            schema.value(), StandardCharsets.UTF_8), 1, Integer::sum);
                        if (!v2Shape(m)) {
                            notV2++;
                        }
                    } else {
                        Header h = r.headers().lastHeader("ktw.dlq.error.reason");
                        String reason = h == null ? "?" : new String(h.value(),
                                                                     StandardCharsets.UTF_8);
                        answered.put(r.key(), "dlq:" + reason);
                        reasons.merge(reason, 1, Integer::sum);
                    }
                }
            }
        }
        System.out.printf("{\"sent\": %d, \"answered\": %d, \"statuses\": %s, \"reasons\": %s, "
                          + "\"schemas\": %s, \"misplaced\": %d, \"not_v2\": %d}%n",
                          sent.size(), answered.size(), json(statuses), json(reasons),
                          json(schemas), misplaced, notV2);
    }

    /** A v2 job: {"v": 2, "id": str, "image": bin} (schemas/moderation-job.v2.schema.json). */
    static byte[] job(String id, byte[] image) throws java.io.IOException {
        MessageBufferPacker pk = MessagePack.newDefaultBufferPacker();
        pk.packMapHeader(3);
        pk.packString("v").packInt(2);
        pk.packString("id").packString(id);
        pk.packString("image").packBinaryHeader(image.length);
        pk.writePayload(image);
        return pk.toByteArray();
    }

    /** v = 2, a rule (str) and models (array) whatever the status, scores keyed model.label. */
    static boolean v2Shape(Map<Value, Value> m) {
        Value v = m.get(ValueFactory.newString("v"));
        Value rule = m.get(ValueFactory.newString("rule"));
        Value models = m.get(ValueFactory.newString("models"));
        Value scores = m.get(ValueFactory.newString("scores"));
        if (v == null || !v.isIntegerValue() || v.asIntegerValue().toInt() != 2
                || rule == null || !rule.isStringValue() || models == null
                || !models.isArrayValue() || scores == null || !scores.isMapValue()) {
            return false;
        }
        for (Value key : scores.asMapValue().keySet()) {
            if (!key.isStringValue() || !key.asStringValue().asString().contains(".")) {
                return false;
            }
        }
        return true;
    }

    static String json(Map<String, Integer> m) {
        StringBuilder b = new StringBuilder("{");
        for (Map.Entry<String, Integer> e : m.entrySet()) {
            b.append(b.length() > 1 ? ", " : "").append('"').append(e.getKey()).append("\": ")
             .append(e.getValue());
        }
        return b.append('}').toString();
    }
}
