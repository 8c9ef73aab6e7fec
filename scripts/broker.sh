#!/usr/bin/env bash
# Starts, stops or reports the local single-node Apache Kafka (KRaft) that weir's tests and demo use.
#   scripts/broker.sh start|stop|status|jars
# Jars come from Maven (broker/pom.xml) into .weir/kafka/libs, data lives in .weir/kafka-data.
# Listens on 127.0.0.1:${WEIR_KAFKA_PORT:-19092} only. KAFKA_BOOTSTRAP set => an external broker is used
# and this script does nothing.
# Other instances: WEIR_STATE_DIR (data, pid, config), WEIR_KAFKA_PORT, WEIR_KAFKA_CONTROLLER_PORT, and
# WEIR_KAFKA_LIBS (the jars; default $WEIR_STATE_DIR/kafka/libs) to share jars already fetched.
# WEIR_KAFKA_SASL=1: the client listener is SASL_PLAINTEXT with mechanism PLAIN, one user
# WEIR_KAFKA_SASL_USERNAME (default weir) with password WEIR_KAFKA_SASL_PASSWORD (default weir-secret);
# clients then need WEIR_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT and that user (see app/settings.py).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
state_dir="${WEIR_STATE_DIR:-$root/.weir}"
libs="${WEIR_KAFKA_LIBS:-$state_dir/kafka/libs}"
data="$state_dir/kafka-data"
port="${WEIR_KAFKA_PORT:-19092}"
controller_port="${WEIR_KAFKA_CONTROLLER_PORT:-19093}"
pidfile="$state_dir/kafka.pid"
config="$state_dir/kafka/server.properties"
ready_timeout="${WEIR_KAFKA_READY_TIMEOUT:-60}"
sasl="${WEIR_KAFKA_SASL:-0}"
sasl_user="${WEIR_KAFKA_SASL_USERNAME:-weir}"
sasl_password="${WEIR_KAFKA_SASL_PASSWORD:-weir-secret}"

die() { echo "broker: $*" >&2; exit 1; }

need_java() {
  command -v java >/dev/null 2>&1 || die "Java 17 or newer is required to run Kafka: install it (Debian: apt-get install openjdk-17-jre-headless) or set KAFKA_BOOTSTRAP=host:port to use an existing broker."
  local major
  major="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)"
  [ -n "$major" ] && [ "$major" -ge 17 ] || die "Java 17 or newer is required to run Kafka 4.x, found: $(java -version 2>&1 | head -1)"
}

fetch_jars() {
  if [ -f "$libs/.complete" ] && [ "$libs/.complete" -nt "$root/broker/pom.xml" ]; then return 0; fi
  command -v mvn >/dev/null 2>&1 || die "Maven (mvn) is required to fetch Kafka's jars: install it (Debian: apt-get install maven) or set KAFKA_BOOTSTRAP=host:port to use an existing broker."
  echo "broker: resolving Kafka jars with mvn (first run only)..."
  rm -rf "$libs"; mkdir -p "$libs"
  mvn -q -B -f "$root/broker/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$libs" -DincludeScope=runtime >"$state_dir/mvn.log" 2>&1 \
    || { tail -30 "$state_dir/mvn.log" >&2; die "mvn could not resolve Kafka's jars (log: $state_dir/mvn.log)"; }
  touch "$libs/.complete"
}

is_running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }

# The client listener: PLAINTEXT, or with WEIR_KAFKA_SASL=1 SASL_PLAINTEXT/PLAIN with one JAAS user
# (the broker's own inter-broker connections log in as that user too). The controller stays PLAINTEXT
# on 127.0.0.1: only this node talks to it.
listener_config() {
  if [ "$sasl" = "1" ]; then
    case "$sasl_user$sasl_password" in *'"'*|*'\\'*|*';'*) die "WEIR_KAFKA_SASL_USERNAME/PASSWORD must not contain '\"', '\\' or ';' (JAAS syntax)" ;; esac
    [ -n "$sasl_user" ] && [ -n "$sasl_password" ] || die "WEIR_KAFKA_SASL=1 needs a non-empty user and password"
    cat <<PROPS
listeners=SASL_PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=SASL_PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_PLAINTEXT
listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT
sasl.enabled.mechanisms=PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="$sasl_user" password="$sasl_password" user_$sasl_user="$sasl_password";
PROPS
  else
    cat <<PROPS
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
PROPS
  fi
}

write_config() {
  mkdir -p "$(dirname "$config")"
  local listeners
  listeners="$(listener_config)"
  # the file may hold the SASL password: readable by its owner only
  (umask 077; cat >"$config" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$controller_port
$listeners
log.dirs=$data
num.partitions=4
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.consumer.session.timeout.ms=45000
group.min.session.timeout.ms=1000
auto.create.topics.enable=true
log.cleaner.enable=true
log.cleaner.backoff.ms=1000
log.segment.bytes=67108864
log.retention.check.interval.ms=60000
transaction.abort.timed.out.transaction.cleanup.interval.ms=5000
transaction.remove.expired.transaction.cleanup.interval.ms=60000
PROPS
  )
}

classpath() { echo "$libs/*"; }

start() {
  if [ -n "${KAFKA_BOOTSTRAP:-}" ]; then echo "broker: KAFKA_BOOTSTRAP=$KAFKA_BOOTSTRAP set, using that broker"; return 0; fi
  mkdir -p "$state_dir"
  if is_running && port_open; then echo "broker: already running on 127.0.0.1:$port (pid $(cat "$pidfile"))"; return 0; fi
  if port_open; then die "port $port is taken by another process: stop it or set WEIR_KAFKA_PORT"; fi
  need_java
  fetch_jars
  write_config
  local java_opts=(-Xms256m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true
                   "-Dlog4j2.configurationFile=$root/broker/log4j2.properties" "-Dweir.log.dir=$state_dir/kafka")
  if [ ! -f "$data/meta.properties" ]; then
    mkdir -p "$data"
    java "${java_opts[@]}" -cp "$(classpath)" kafka.tools.StorageTool format --standalone \
        -t "$(java -cp "$(classpath)" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)" \
        -c "$config" >"$state_dir/kafka/format.log" 2>&1 \
      || { cat "$state_dir/kafka/format.log" >&2; die "formatting the KRaft log dir failed"; }
  fi
  nohup java "${java_opts[@]}" -cp "$(classpath)" kafka.Kafka "$config" \
      >"$state_dir/kafka/stdout.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  local waited=0
  until port_open && grep -q "Kafka Server started" "$state_dir/kafka/server.log" 2>/dev/null; do
    if ! is_running; then tail -40 "$state_dir/kafka/stdout.log" "$state_dir/kafka/server.log" >&2 2>/dev/null; die "Kafka exited during start"; fi
    sleep 0.5; waited=$((waited + 1))
    [ "$waited" -lt $((ready_timeout * 2)) ] || die "Kafka not ready after ${ready_timeout}s (logs in $state_dir/kafka)"
  done
  echo "broker: Apache Kafka ready on 127.0.0.1:$port (pid $(cat "$pidfile"), data in $data)"
}

stop() {
  if ! is_running; then rm -f "$pidfile"; echo "broker: not running"; return 0; fi
  local pid; pid="$(cat "$pidfile")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
  echo "broker: stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if is_running; then echo "broker: running (pid $(cat "$pidfile")) on 127.0.0.1:$port"; else echo "broker: stopped"; exit 1; fi ;;
  jars) need_java; mkdir -p "$state_dir"; fetch_jars ;;
  wipe) stop; rm -rf "$data"; echo "broker: data wiped" ;;
  *) echo "usage: $0 start|stop|status|jars|wipe" >&2; exit 2 ;;
esac
