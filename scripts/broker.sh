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
# WEIR_KAFKA_TLS=1: the client listener (also the inter-broker one) uses TLS: SSL, or SASL_SSL together with
# WEIR_KAFKA_SASL=1. The first start (per state dir) makes with openssl a private CA and a broker certificate
# signed by it for 127.0.0.1 and localhost, in $WEIR_STATE_DIR/kafka/tls: ca.pem (what clients trust:
# WEIR_KAFKA_SSL_CAFILE), broker.p12 (the broker's PKCS12 keystore) and keystore.password (its random
# password), owner-only. The CA's key is deleted once it has signed. Clients then need
# WEIR_KAFKA_SECURITY_PROTOCOL=SSL (or SASL_SSL and the user) and WEIR_KAFKA_SSL_CAFILE=<that ca.pem>.
# The controller listener stays PLAINTEXT on 127.0.0.1 whatever these say.
# WEIR_KAFKA_NODES=3: a cluster of that many KRaft nodes on this machine, each broker and controller (a static
# quorum of all of them), node i listening on WEIR_KAFKA_PORT + 10*(i-1) and WEIR_KAFKA_CONTROLLER_PORT + 10*(i-1)
# (or the i-th of the comma-separated WEIR_KAFKA_PORTS / WEIR_KAFKA_CONTROLLER_PORTS), its data, config, log and
# pid file in $WEIR_STATE_DIR/kafka-<i>. Internal topics are replicated min(3, nodes) times with
# min.insync.replicas one less (at least 1). start, stop, status and wipe act on every node; start-node,
# stop-node and kill-node (SIGKILL) on node N alone: scripts/broker.sh kill-node 2. Not with SASL or TLS.
# Every node: a transaction past its timeout is aborted within a second of it (the coordinator looks every second;
# Kafka's default is every 10 s): a SIGKILLed worker's open transaction stops holding read_committed readers back about as soon
# as its timeout ends. A node that stops heartbeating is fenced by the controller after 4 s (Kafka's default: 9 s),
# so that the leaders, group and transaction coordinators of a SIGKILLed node move sooner; the nodes share one
# machine, where a heartbeat is not lost to the network.
# WEIR_KAFKA_PROXY_PORT (with WEIR_KAFKA_PROXIED_PORT): a second listener on 127.0.0.1:$WEIR_KAFKA_PROXIED_PORT,
# advertised as 127.0.0.1:$WEIR_KAFKA_PROXY_PORT, where a proxy forwards to it (the tests' fault proxy): clients
# that bootstrap there reach the broker only through the proxy. Comma-separated lists of as many ports each give a
# listener per pair (PROXIED1, PROXIED2, ...), so that each client, behind a proxy of its own, can be cut off alone.
# One PLAINTEXT node only.
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
tls="${WEIR_KAFKA_TLS:-0}"
tls_dir="$state_dir/kafka/tls"
ca_file="$tls_dir/ca.pem"
keystore="$tls_dir/broker.p12"
keystore_password_file="$tls_dir/keystore.password"
tls_days=825
nodes="${WEIR_KAFKA_NODES:-1}"
base_port="$port"
base_controller_port="$controller_port"
node_id=1
log_dir="$state_dir/kafka"

die() { echo "broker: $*" >&2; exit 1; }

# The i-th of a comma-separated list, or base + 10*(i-1).
nth_port() { local list="$1" base="$2" i="$3"; if [ -n "$list" ]; then echo "$list" | cut -d, -f"$i"; else echo $((base + 10 * (i - 1))); fi; }

# Points the per-node globals (ports, data, config, logs, pid file) at node $1 of a cluster (WEIR_KAFKA_NODES > 1).
select_node() {
  node_id="$1"
  [ "$node_id" -ge 1 ] && [ "$node_id" -le "$nodes" ] 2>/dev/null || die "no node $node_id: WEIR_KAFKA_NODES=$nodes"
  port="$(nth_port "${WEIR_KAFKA_PORTS:-}" "$base_port" "$node_id")"
  controller_port="$(nth_port "${WEIR_KAFKA_CONTROLLER_PORTS:-}" "$base_controller_port" "$node_id")"
  log_dir="$state_dir/kafka-$node_id"
  data="$log_dir/data"
  pidfile="$log_dir/kafka.pid"
  config="$log_dir/server.properties"
}

# The static quorum of a cluster: every node is a voter.
quorum_voters() {
  local i voters=""
  for i in $(seq 1 "$nodes"); do
    voters="$voters${voters:+,}$i@127.0.0.1:$(nth_port "${WEIR_KAFKA_CONTROLLER_PORTS:-}" "$base_controller_port" "$i")"
  done
  echo "$voters"
}

# Whether a missing prerequisite may be installed here: as root on a Debian-like system (as scripts/chromium.sh
# does for Chromium). Elsewhere the script stops with one line naming what to install.
can_install() { [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; }

# Installs the distribution's packages with apt-get, saying so in one line; apt's own output goes to a log,
# shown only when it fails.
apt_install() {
  local what="$1"; shift
  local log="$state_dir/apt.log"
  mkdir -p "$state_dir"
  echo "broker: $what is missing: installing $* from the distribution's packages (apt-get, as root)"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@"; } >"$log" 2>&1 \
    || { tail -20 "$log" >&2; die "apt-get could not install $* (log: $log)"; }
}

# The first Java 17+ runtime the distribution offers (Debian 12 and Ubuntu 22.04+ have 17; Debian 13 has 21).
java_package() {
  local package
  for package in openjdk-17-jre-headless openjdk-21-jre-headless; do
    if apt-cache show "$package" >/dev/null 2>&1; then echo "$package"; return 0; fi
  done
  echo openjdk-17-jre-headless  # not in the lists yet: apt-get update may bring it
}

java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }

has_java() {
  local major
  command -v java >/dev/null 2>&1 || return 1
  major="$(java_major)"
  [ -n "$major" ] && [ "$major" -ge 17 ]
}

need_java() {
  if ! has_java && can_install; then apt_install "Java 17 or newer" "$(java_package)"; hash -r; fi
  command -v java >/dev/null 2>&1 || die "Java 17 or newer is required to run Kafka: install it (Debian: apt-get install openjdk-17-jre-headless) or set KAFKA_BOOTSTRAP=host:port to use an existing broker."
  has_java || die "Java 17 or newer is required to run Kafka 4.x, found: $(java -version 2>&1 | head -1)"
}

need_maven() {
  if ! command -v mvn >/dev/null 2>&1 && can_install; then apt_install "Maven (mvn)" maven; hash -r; fi
  command -v mvn >/dev/null 2>&1 || die "Maven (mvn) is required to fetch Kafka's jars: install it (Debian: apt-get install maven) or set KAFKA_BOOTSTRAP=host:port to use an existing broker."
}

fetch_jars() {
  if [ -f "$libs/.complete" ] && [ "$libs/.complete" -nt "$root/broker/pom.xml" ]; then return 0; fi
  need_maven
  echo "broker: resolving Kafka jars with mvn (first run only)..."
  rm -rf "$libs"; mkdir -p "$libs"
  mvn -q -B -f "$root/broker/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$libs" -DincludeScope=runtime >"$state_dir/mvn.log" 2>&1 \
    || { tail -30 "$state_dir/mvn.log" >&2; die "mvn could not resolve Kafka's jars (log: $state_dir/mvn.log)"; }
  touch "$libs/.complete"
}

is_running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }

# The client listener's security protocol: PLAINTEXT, SASL_PLAINTEXT (WEIR_KAFKA_SASL=1), SSL
# (WEIR_KAFKA_TLS=1) or SASL_SSL (both).
client_protocol() {
  case "$sasl:$tls" in
    1:1) echo SASL_SSL ;;
    1:*) echo SASL_PLAINTEXT ;;
    *:1) echo SSL ;;
    *) echo PLAINTEXT ;;
  esac
}

# The broker's TLS material, made once per state dir (again when the certificate expires within a day):
# a private CA (its key deleted once it has signed) and a certificate for 127.0.0.1/localhost signed by
# it, in a PKCS12 keystore with a random password. Made in a scratch dir, moved in place when complete.
ensure_tls() {
  if [ -s "$ca_file" ] && [ -s "$keystore" ] && [ -s "$keystore_password_file" ] \
     && openssl x509 -checkend 86400 -noout -in "$tls_dir/broker.pem" >/dev/null 2>&1; then return 0; fi
  command -v openssl >/dev/null 2>&1 || die "openssl is required for WEIR_KAFKA_TLS=1 (it makes the broker's certificate): install it (Debian: apt-get install openssl)"
  local work="$state_dir/kafka/tls.new" log="$state_dir/kafka/tls.log" ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  mkdir -p "$state_dir/kafka"
  rm -rf "$work"
  # umask 077: the keys, the password and the keystore are the owner's only; the certificates are public
  if ! (umask 077 && mkdir -p "$work" && cd "$work" \
        && openssl rand -hex 24 >keystore.password \
        && openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days "$tls_days" -sha256 \
             -subj "/CN=weir local Kafka CA $(openssl rand -hex 4)" \
             -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        && openssl req -new "${ec[@]}" -keyout broker.key -out broker.csr -subj "/CN=localhost" \
        && printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
             "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost" \
             "subjectKeyIdentifier=hash" "authorityKeyIdentifier=keyid" >broker.ext \
        && openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
             -days "$tls_days" -sha256 -extfile broker.ext -out broker.pem \
        && openssl pkcs12 -export -name broker -in broker.pem -inkey broker.key -certfile ca.pem \
             -passout file:keystore.password -out broker.p12 \
        && rm -f ca.key broker.key broker.csr broker.ext \
        && chmod 644 ca.pem broker.pem) >"$log" 2>&1; then
    rm -rf "$work"; cat "$log" >&2; die "making the broker's TLS certificate failed (log: $log)"
  fi
  rm -rf "$tls_dir"
  mv "$work" "$tls_dir"
}

# The client listener: PLAINTEXT, or with WEIR_KAFKA_SASL=1 SASL_PLAINTEXT/PLAIN with one JAAS user
# (the broker's own inter-broker connections log in as that user too), over TLS with WEIR_KAFKA_TLS=1
# (SSL or SASL_SSL; the inter-broker client trusts ca.pem and checks the name 127.0.0.1). The controller
# stays PLAINTEXT on 127.0.0.1: only this node talks to it.
listener_config() {
  local protocol
  protocol="$(client_protocol)"
  if [ "$sasl" = "1" ]; then
    case "$sasl_user$sasl_password" in *'"'*|*'\\'*|*';'*) die "WEIR_KAFKA_SASL_USERNAME/PASSWORD must not contain '\"', '\\' or ';' (JAAS syntax)" ;; esac
    [ -n "$sasl_user" ] && [ -n "$sasl_password" ] || die "WEIR_KAFKA_SASL=1 needs a non-empty user and password"
  fi
  if [ -n "${WEIR_KAFKA_PROXY_PORT:-}" ]; then
    # a second listener, advertised on a proxy's port: its clients reach the broker only through the proxy
    [ "$protocol" = PLAINTEXT ] && [ "$nodes" = 1 ] || die "WEIR_KAFKA_PROXY_PORT runs with one PLAINTEXT node only"
    [ -n "${WEIR_KAFKA_PROXIED_PORT:-}" ] || die "WEIR_KAFKA_PROXY_PORT needs WEIR_KAFKA_PROXIED_PORT (the port the proxy forwards to)"
    local proxy_ports proxied_ports listeners advertised map i
    IFS=, read -r -a proxy_ports <<<"$WEIR_KAFKA_PROXY_PORT"
    IFS=, read -r -a proxied_ports <<<"$WEIR_KAFKA_PROXIED_PORT"
    [ "${#proxy_ports[@]}" = "${#proxied_ports[@]}" ] || die "WEIR_KAFKA_PROXY_PORT and WEIR_KAFKA_PROXIED_PORT must list as many ports"
    listeners="PLAINTEXT://127.0.0.1:$port"
    advertised="PLAINTEXT://127.0.0.1:$port"
    map="PLAINTEXT:PLAINTEXT"
    for i in "${!proxy_ports[@]}"; do
      # one listener: PROXIED (as before); several: PROXIED1, PROXIED2, ...
      local name="PROXIED"
      [ "${#proxy_ports[@]}" = 1 ] || name="PROXIED$((i + 1))"
      listeners="$listeners,$name://127.0.0.1:${proxied_ports[$i]}"
      advertised="$advertised,$name://127.0.0.1:${proxy_ports[$i]}"
      map="$map,$name:PLAINTEXT"
    done
    cat <<PROPS
listeners=$listeners,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$map,CONTROLLER:PLAINTEXT
PROPS
    return 0
  fi
  cat <<PROPS
listeners=$protocol://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=$protocol://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=$protocol
listener.security.protocol.map=$protocol:$protocol,CONTROLLER:PLAINTEXT
PROPS
  if [ "$sasl" = "1" ]; then
    cat <<PROPS
sasl.enabled.mechanisms=PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.${protocol,,}.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="$sasl_user" password="$sasl_password" user_$sasl_user="$sasl_password";
PROPS
  fi
  if [ "$tls" = "1" ]; then
    cat <<PROPS
ssl.keystore.type=PKCS12
ssl.keystore.location=$keystore
ssl.keystore.password=$(cat "$keystore_password_file")
ssl.truststore.type=PEM
ssl.truststore.location=$ca_file
ssl.endpoint.identification.algorithm=https
ssl.client.auth=none
PROPS
  fi
}

write_config() {
  mkdir -p "$(dirname "$config")"
  local listeners quorum replicas=1 min_isr=1
  listeners="$(listener_config)"
  if [ "$nodes" -gt 1 ]; then
    quorum="controller.quorum.voters=$(quorum_voters)"
    replicas=$((nodes < 3 ? nodes : 3))
    min_isr=$((replicas > 1 ? replicas - 1 : 1))
  else
    quorum="controller.quorum.bootstrap.servers=127.0.0.1:$controller_port"
  fi
  # the file may hold the SASL password and the keystore's: readable by its owner only
  (umask 077; cat >"$config" <<PROPS
process.roles=broker,controller
node.id=$node_id
$quorum
$listeners
log.dirs=$data
num.partitions=4
default.replication.factor=$replicas
min.insync.replicas=$min_isr
offsets.topic.replication.factor=$replicas
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$min_isr
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor=$replicas
share.coordinator.state.topic.min.isr=$min_isr
group.initial.rebalance.delay.ms=0
group.consumer.session.timeout.ms=45000
group.min.session.timeout.ms=1000
auto.create.topics.enable=true
log.cleaner.enable=true
log.cleaner.backoff.ms=1000
log.segment.bytes=67108864
log.retention.check.interval.ms=60000
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=4000
transaction.remove.expired.transaction.cleanup.interval.ms=60000
PROPS
  )
}

classpath() { echo "$libs/*"; }

# With WEIR_KAFKA_TLS=1: where the CA certificate clients must trust is (from the config the broker runs
# with: one already running may have been started without TLS).
tls_note() {
  [ "$tls" = "1" ] || return 0
  if grep -qxF "ssl.truststore.location=$ca_file" "$config" 2>/dev/null; then
    echo "broker: TLS ($(sed -n 's/^inter.broker.listener.name=//p' "$config")) on 127.0.0.1:$port; clients trust the CA in $ca_file (WEIR_KAFKA_SSL_CAFILE=$ca_file)"
  else
    echo "broker: WEIR_KAFKA_TLS=1, but the running broker was started without TLS: stop it and start it again" >&2
  fi
}

# Formats the current node's log dir once (a cluster's nodes with one cluster id), then starts its JVM.
launch() {
  local opts=(-Xms256m -Xmx1g -Djava.awt.headless=true
              "-Dlog4j2.configurationFile=$root/broker/log4j2.properties" "-Dweir.log.dir=$log_dir")
  # shellcheck disable=SC2206  # WEIR_KAFKA_JVM_OPTS: JVM options instead of the G1 collector, split on spaces
  opts+=(${WEIR_KAFKA_JVM_OPTS:--XX:+UseG1GC})
  write_config
  if [ ! -f "$data/meta.properties" ]; then
    mkdir -p "$data"
    local format=(--standalone) cluster_id
    if [ "$nodes" -gt 1 ]; then
      format=()
      [ -s "$state_dir/cluster.id" ] || java -cp "$(classpath)" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1 >"$state_dir/cluster.id"
      cluster_id="$(cat "$state_dir/cluster.id")"
    else
      cluster_id="$(java -cp "$(classpath)" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)"
    fi
    java "${opts[@]}" -cp "$(classpath)" kafka.tools.StorageTool format "${format[@]}" -t "$cluster_id" -c "$config" \
        >"$log_dir/format.log" 2>&1 \
      || { cat "$log_dir/format.log" >&2; die "formatting the KRaft log dir of node $node_id failed"; }
  fi
  nohup java "${opts[@]}" -cp "$(classpath)" kafka.Kafka "$config" >"$log_dir/stdout.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
}

# Waits until the current node serves clients.
wait_ready() {
  local waited=0
  until port_open && grep -q "Kafka Server started" "$log_dir/server.log" 2>/dev/null; do
    if ! is_running; then tail -40 "$log_dir/stdout.log" "$log_dir/server.log" >&2 2>/dev/null || true; die "Kafka node $node_id exited during start"; fi
    sleep 0.5; waited=$((waited + 1))
    [ "$waited" -lt $((ready_timeout * 2)) ] || die "Kafka node $node_id not ready after ${ready_timeout}s (logs in $log_dir)"
  done
}

start() {
  if [ -n "${KAFKA_BOOTSTRAP:-}" ]; then echo "broker: KAFKA_BOOTSTRAP=$KAFKA_BOOTSTRAP set, using that broker"; return 0; fi
  mkdir -p "$state_dir"
  if is_running && port_open; then echo "broker: already running on 127.0.0.1:$port (pid $(cat "$pidfile"))"; tls_note; return 0; fi
  if port_open; then die "port $port is taken by another process: stop it or set WEIR_KAFKA_PORT"; fi
  need_java
  fetch_jars
  if [ "$tls" = "1" ]; then ensure_tls; fi
  launch
  wait_ready
  echo "broker: Apache Kafka ready on 127.0.0.1:$port (pid $(cat "$pidfile"), data in $data)"
  tls_note
}

# The cluster's bootstrap servers: every node's client listener.
cluster_bootstrap() {
  local i servers=""
  for i in $(seq 1 "$nodes"); do servers="$servers${servers:+,}127.0.0.1:$(nth_port "${WEIR_KAFKA_PORTS:-}" "$base_port" "$i")"; done
  echo "$servers"
}

# Starts the given nodes of the cluster (all by default) and waits until each serves clients: a static quorum
# elects its leader once a majority of the voters is up, so the nodes start side by side.
cluster_start() {
  [ -z "${KAFKA_BOOTSTRAP:-}" ] || { echo "broker: KAFKA_BOOTSTRAP=$KAFKA_BOOTSTRAP set, using that broker"; return 0; }
  [ "$sasl" != "1" ] && [ "$tls" != "1" ] || die "WEIR_KAFKA_NODES>1 runs without SASL and TLS"
  mkdir -p "$state_dir"
  need_java
  fetch_jars
  local i started=()
  for i in "$@"; do
    select_node "$i"
    if is_running; then continue; fi
    if port_open; then die "port $port (node $i) is taken by another process"; fi
    launch
    started+=("$i")
  done
  for i in "${started[@]}"; do select_node "$i"; wait_ready; done
  local up="$*"
  echo "broker: Apache Kafka cluster of $nodes nodes on $(cluster_bootstrap) (node(s) ${up// /,} up, data in $state_dir/kafka-<node>)"
}

stop() {
  if ! is_running; then rm -f "$pidfile"; echo "broker: not running"; return 0; fi
  local pid; pid="$(cat "$pidfile")"
  kill "-${1:-TERM}" "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
  echo "broker: stopped"
}

all_nodes() { seq 1 "$nodes"; }

if [ "$nodes" -gt 1 ]; then
  node_arg="${2:-}"
  case "${1:-}" in
    start) cluster_start $(all_nodes) ;;
    stop) for i in $(all_nodes); do select_node "$i"; echo -n "node $i: "; stop; done ;;
    status)
      down=0
      for i in $(all_nodes); do
        select_node "$i"
        if is_running; then echo "broker: node $i running (pid $(cat "$pidfile")) on 127.0.0.1:$port"; else echo "broker: node $i stopped"; down=1; fi
      done
      exit "$down" ;;
    start-node) [ -n "$node_arg" ] || die "usage: $0 start-node N"; cluster_start "$node_arg" ;;
    stop-node) [ -n "$node_arg" ] || die "usage: $0 stop-node N"; select_node "$node_arg"; stop ;;
    kill-node) [ -n "$node_arg" ] || die "usage: $0 kill-node N"; select_node "$node_arg"; stop KILL ;;
    bootstrap) echo "$(cluster_bootstrap)" ;;
    jars) need_java; mkdir -p "$state_dir"; fetch_jars ;;
    wipe) for i in $(all_nodes); do select_node "$i"; stop; rm -rf "$data"; done; rm -f "$state_dir/cluster.id"; echo "broker: data wiped" ;;
    *) echo "usage: $0 start|stop|status|start-node N|stop-node N|kill-node N|bootstrap|jars|wipe" >&2; exit 2 ;;
  esac
  exit 0
fi

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if is_running; then echo "broker: running (pid $(cat "$pidfile")) on 127.0.0.1:$port"; else echo "broker: stopped"; exit 1; fi ;;
  jars) need_java; mkdir -p "$state_dir"; fetch_jars ;;
  wipe) stop; rm -rf "$data"; echo "broker: data wiped" ;;
  *) echo "usage: $0 start|stop|status|jars|wipe" >&2; exit 2 ;;
esac
