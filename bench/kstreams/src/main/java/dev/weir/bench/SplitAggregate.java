package dev.weir.bench;

import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The split/aggregate work of bench/quix_split_aggregate.py, on Kafka Streams, for `python -m bench.compare`.
 *
 * <p>Environment (bench/compare.py sets it, and starts as many such processes, one application id, as weir has
 * workers for the same work): KAFKA_BOOTSTRAP, BENCH_APP_ID, BENCH_ORDERS, BENCH_ITEMS, BENCH_AGGREGATES,
 * BENCH_PARTITIONS, BENCH_COMMIT_INTERVAL (seconds), BENCH_PRODUCER_LINGER_MS, BENCH_STATE_DIR, BENCH_SPLIT_CHUNK,
 * BENCH_CATALOGUE (the shop's catalogue as JSON: flavour to cents per scoop) and BENCH_KSTREAMS_FORM:
 *
 * <ul>
 *   <li>{@code inline}: one stage, orders -> every item priced, the result built -> aggregates;
 *   <li>{@code chunks}: orders -> chunks of BENCH_SPLIT_CHUNK items keyed {@code order#first index} -> items ->
 *       priced -> re-keyed by order id (a repartition topic) -> merged by index per order in a persistent
 *       (RocksDB, changelogged) store -> the result once all are in -> aggregates.
 * </ul>
 *
 * <p>Every result has the shape of weir's aggregate (status, reason, expected_count, items with their outcomes,
 * missing, failed), checked by the harness against the order's catalogue total. Exactly-once v2, one stream
 * thread per process, every other setting Kafka Streams' default.
 */
public final class SplitAggregate {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final TypeReference<Map<String, Object>> OBJECT = new TypeReference<>() {};
  private static final String STORE = "merged";
  private static Map<String, Integer> catalogue = Map.of();

  private SplitAggregate() {}

  static String env(String name, String fallback) {
    String value = System.getenv(name);
    return value == null || value.isEmpty() ? fallback : value;
  }

  static Map<String, Object> read(byte[] value) {
    try {
      return JSON.readValue(value, OBJECT);
    } catch (java.io.IOException error) {
      throw new IllegalArgumentException("not a JSON object: " + error.getMessage(), error);
    }
  }

  static byte[] write(Object value) {
    try {
      return JSON.writeValueAsBytes(value);
    } catch (java.io.IOException error) {
      throw new IllegalStateException(error);
    }
  }

  /** The demo's item step (examples/pricing.py's price_item) on one item, as an outcome. */
  static Map<String, Object> outcomeOf(int index, Object payload, int total) {
    Map<String, Object> outcome = new LinkedHashMap<>();
    outcome.put("index", index);
    outcome.put("last", index == total - 1);
    Object flavour = payload instanceof Map<?, ?> map ? map.get("flavour") : null;
    Object scoops = payload instanceof Map<?, ?> map ? map.get("scoops") : null;
    if (!(flavour instanceof String name) || !catalogue.containsKey(name)) {
      outcome.put("ok", false);
      outcome.put("result", null);
      outcome.put("error", "item step 'price': unknown flavour " + flavour);
    } else if (!(scoops instanceof Integer count) || count <= 0) {
      outcome.put("ok", false);
      outcome.put("result", null);
      outcome.put("error", "item step 'price': 'scoops' must be a positive integer, got " + scoops);
    } else {
      Map<String, Object> result = new LinkedHashMap<>();
      result.put("flavour", name);
      result.put("scoops", count);
      result.put("price_cents", catalogue.get(name) * count);
      outcome.put("ok", true);
      outcome.put("result", result);
      outcome.put("error", null);
    }
    return outcome;
  }

  /** The aggregate of an order whose every outcome is here, in weir's shape. */
  static Map<String, Object> resultOf(String correlationId, int total, List<Map<String, Object>> outcomes) {
    List<Map<String, Object>> byIndex = new ArrayList<>(outcomes);
    byIndex.sort(Comparator.comparingInt(outcome -> (Integer) outcome.get("index")));
    List<Map<String, Object>> items = new ArrayList<>();
    List<Integer> failed = new ArrayList<>();
    for (Map<String, Object> outcome : byIndex) {
      Map<String, Object> item = new LinkedHashMap<>();
      item.put("index", outcome.get("index"));
      if (Boolean.TRUE.equals(outcome.get("ok"))) {
        item.put("status", "ok");
        item.put("result", outcome.get("result"));
      } else {
        item.put("status", "failed");
        item.put("error", outcome.get("error"));
        failed.add((Integer) outcome.get("index"));
      }
      items.add(item);
    }
    Map<String, Object> result = new LinkedHashMap<>();
    result.put("correlation_id", correlationId);
    result.put("aggregator", "order-items");
    result.put("status", "complete");
    result.put("reason", "flag");
    result.put("expected_count", total);
    result.put("items", items);
    result.put("missing", List.of());
    result.put("failed", failed);
    result.put("completed_ms", System.currentTimeMillis());
    return result;
  }

  @SuppressWarnings("unchecked")
  static byte[] priceOrder(byte[] value) {
    Map<String, Object> order = read(value);
    List<Object> items = (List<Object>) order.get("items");
    List<Map<String, Object>> outcomes = new ArrayList<>(items.size());
    for (int index = 0; index < items.size(); index++) {
      outcomes.add(outcomeOf(index, items.get(index), items.size()));
    }
    return write(resultOf((String) order.get("order_id"), items.size(), outcomes));
  }

  @SuppressWarnings("unchecked")
  static List<KeyValue<String, byte[]>> chunksOf(byte[] value, int chunk) {
    Map<String, Object> order = read(value);
    List<Object> items = (List<Object>) order.get("items");
    String orderId = (String) order.get("order_id");
    List<KeyValue<String, byte[]>> chunks = new ArrayList<>();
    for (int first = 0; first < items.size(); first += chunk) {
      List<Map<String, Object>> part = new ArrayList<>();
      for (int index = first; index < Math.min(first + chunk, items.size()); index++) {
        part.add(Map.of("index", index, "payload", items.get(index)));
      }
      Map<String, Object> message = new LinkedHashMap<>();
      message.put("correlation_id", orderId);
      message.put("total", items.size());
      message.put("items", part);
      chunks.add(KeyValue.pair(orderId + "#" + first, write(message)));
    }
    return chunks;
  }

  @SuppressWarnings("unchecked")
  static KeyValue<String, byte[]> priceChunk(byte[] value) {
    Map<String, Object> chunk = read(value);
    int total = (Integer) chunk.get("total");
    List<Map<String, Object>> outcomes = new ArrayList<>();
    for (Map<String, Object> item : (List<Map<String, Object>>) chunk.get("items")) {
      outcomes.add(outcomeOf((Integer) item.get("index"), item.get("payload"), total));
    }
    Map<String, Object> priced = new LinkedHashMap<>();
    priced.put("correlation_id", chunk.get("correlation_id"));
    priced.put("total", total);
    priced.put("outcomes", outcomes);
    return KeyValue.pair((String) chunk.get("correlation_id"), write(priced));
  }

  /** Merges a priced chunk into its order's outcomes (by index, once each); forwards the result once all are in. */
  static final class Merge implements Processor<String, byte[], String, byte[]> {
    private ProcessorContext<String, byte[]> context;
    private KeyValueStore<String, byte[]> store;

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      this.context = context;
      this.store = context.getStateStore(STORE);
    }

    @Override
    @SuppressWarnings("unchecked")
    public void process(Record<String, byte[]> record) {
      byte[] stored = store.get(record.key());
      Map<String, Object> state = stored == null ? new LinkedHashMap<>() : read(stored);
      if (Boolean.TRUE.equals(state.get("done"))) {
        return; // a late or redelivered chunk of a completed order
      }
      Map<String, Object> priced = read(record.value());
      Map<String, Object> merged = new TreeMap<>((Map<String, Object>) state.getOrDefault("items", Map.of()));
      for (Map<String, Object> outcome : (List<Map<String, Object>>) priced.get("outcomes")) {
        merged.putIfAbsent(String.valueOf(outcome.get("index")), outcome);
      }
      int total = (Integer) priced.get("total");
      if (merged.size() < total) {
        store.put(record.key(), write(Map.of("items", merged)));
        return;
      }
      store.put(record.key(), write(Map.of("done", true)));
      List<Map<String, Object>> outcomes = new ArrayList<>();
      for (Object outcome : merged.values()) {
        outcomes.add((Map<String, Object>) outcome);
      }
      context.forward(record.withValue(write(resultOf(record.key(), total, outcomes))));
    }
  }

  public static void main(String[] args) throws Exception {
    catalogue = JSON.readValue(env("BENCH_CATALOGUE", "{}"), new TypeReference<Map<String, Integer>>() {});
    String form = env("BENCH_KSTREAMS_FORM", "chunks");
    int partitions = Integer.parseInt(env("BENCH_PARTITIONS", "4"));
    int chunk = Math.max(1, Integer.parseInt(env("BENCH_SPLIT_CHUNK", "10")));
    String orders = env("BENCH_ORDERS", "bench-kstreams-orders");
    String items = env("BENCH_ITEMS", "bench-kstreams-items");
    String aggregates = env("BENCH_AGGREGATES", "bench-kstreams-aggregates");

    StreamsBuilder builder = new StreamsBuilder();
    Consumed<String, byte[]> consumed = Consumed.with(Serdes.String(), Serdes.ByteArray());
    Produced<String, byte[]> produced = Produced.with(Serdes.String(), Serdes.ByteArray());
    KStream<String, byte[]> input = builder.stream(orders, consumed);
    if (form.equals("inline")) {
      input.mapValues(SplitAggregate::priceOrder).to(aggregates, produced);
    } else if (form.equals("chunks")) {
      input.flatMap((key, value) -> chunksOf(value, chunk)).to(items, produced);
      builder.addStateStore(
          Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.ByteArray()));
      builder.stream(items, consumed)
          .map((key, value) -> priceChunk(value))
          .repartition(Repartitioned.<String, byte[]>with(Serdes.String(), Serdes.ByteArray())
              .withName("by-order").withNumberOfPartitions(partitions))
          .process(Merge::new, STORE)
          .to(aggregates, produced);
    } else {
      throw new IllegalArgumentException("BENCH_KSTREAMS_FORM=" + form + ", expected inline or chunks");
    }

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, env("BENCH_APP_ID", "bench-kstreams"));
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, env("KAFKA_BOOTSTRAP", "127.0.0.1:19092"));
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG,
        Math.round(1000 * Double.parseDouble(env("BENCH_COMMIT_INTERVAL", "0.1"))));
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
    props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
    props.put(StreamsConfig.STATE_DIR_CONFIG, env("BENCH_STATE_DIR", "/tmp/bench-kstreams-state"));
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    props.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG),
        Integer.parseInt(env("BENCH_PRODUCER_LINGER_MS", "0")));

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    CountDownLatch stopped = new CountDownLatch(1);
    streams.setStateListener((now, before) -> {
      System.out.println("kafka streams: " + before + " -> " + now);
      if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
        stopped.countDown();
      }
    });
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      streams.close(java.time.Duration.ofSeconds(20));
      stopped.countDown();
    }));
    streams.start();
    stopped.await();
    System.exit(streams.state() == KafkaStreams.State.ERROR ? 1 : 0);
  }
}
