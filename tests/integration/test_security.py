"""Security basics: a worker on a SASL/PLAIN broker and on a SASL_SSL one (TLS, scripts/broker.sh WEIR_KAFKA_TLS=1),
untrusted certificates and wrong credentials refused, local read-only web views, quiet logs."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import stat
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaConnectionError

from tests.conftest import ROOT
from tests.integration.conftest import Pipeline
from tests.integration.local_broker import BrokerInstance
from weir.app.kafka_io import produce, produce_json, read_topic
from weir.app.processes import WorkerProcess
from weir.app.settings import Settings

#: one pytest process runs the module, so that its brokers (module fixtures) start once
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("security")]

#: Recognisable strings: neither may show up in a worker's log.
SECRET = "s3cr3t-PW-9c1e5b"
PAYLOAD_MARKER = "PAYLOAD-MARKER-7f3a21"
USER = "weir"


def sasl_options(password: str = SECRET) -> dict[str, Any]:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_plain_username": USER, "sasl_plain_password": password}


SASL_ENV = {
    "WEIR_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "WEIR_KAFKA_SASL_MECHANISM": "PLAIN",
    "WEIR_KAFKA_SASL_USERNAME": USER,
    "WEIR_KAFKA_SASL_PASSWORD": SECRET,
}


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerInstance]:
    """A second local Kafka whose only client listener is SASL_PLAINTEXT/PLAIN (user weir, password SECRET)."""
    broker = BrokerInstance(
        tmp_path_factory.mktemp("sasl-broker"),
        extra_env={"WEIR_KAFKA_SASL": "1", "WEIR_KAFKA_SASL_USERNAME": USER, "WEIR_KAFKA_SASL_PASSWORD": SECRET},
    ).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def sasl_pipeline(sasl_broker: BrokerInstance, tmp_path: Path) -> Iterator[Pipeline]:
    unique = uuid.uuid4().hex[:8]
    deployment = Pipeline(bootstrap=sasl_broker.bootstrap, tmp=tmp_path, prefix=f"s{unique}.", app_id=f"s{unique}")
    yield deployment
    deployment.stop_all()


def start_sasl_worker(pipeline: Pipeline, agents: str = "all") -> WorkerProcess:
    # WEIR_WEB_HOST unset: the worker binds its web server where the default says
    worker = pipeline.start_worker(agents, **SASL_ENV)
    worker.env.pop("WEIR_WEB_HOST", None)
    return worker


def listening_addresses(pid: int, port: int) -> list[str]:
    """Local addresses of the TCP sockets of process ``pid`` listening on ``port`` (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    addresses = []
    for table, family in (("tcp", 4), ("tcp6", 6)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            host_hex, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port or inode not in inodes:
                continue
            if family == 6 and host_hex.startswith("0000000000000000FFFF0000"):  # ::ffff:a.b.c.d (how Java binds IPv4)
                family, host_hex = 4, host_hex[-8:]
            if family == 4:  # one 32-bit word in little-endian hex
                addresses.append(".".join(str(int(host_hex[i : i + 2], 16)) for i in (6, 4, 2, 0)))
            else:
                addresses.append(f"ipv6:{host_hex}")
    return addresses


def http(url: str, method: str) -> int:
    request = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def run_orders(pipeline: Pipeline, orders: list[tuple[str, Any]], options: dict[str, Any]) -> list[dict[str, Any]]:
    """Send ``orders`` over the secured connection and read one aggregate per order back through it."""
    assert asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("orders"), orders, client_options=options)) == len(orders)
    return asyncio.run(
        read_topic(
            pipeline.bootstrap,
            pipeline.topic("aggregates"),
            until=lambda rows: len(rows) >= len(orders),
            timeout_s=90,
            decode=orjson.loads,
            client_options=options,
        )
    )


def test_a_worker_on_a_sasl_broker_completes_an_order_and_logs_no_secret_or_payload(sasl_pipeline: Pipeline) -> None:
    worker = start_sasl_worker(sasl_pipeline)
    worker.wait_ready(120)
    order = {"order_id": "o-secure", "items": [{"value": f"{PAYLOAD_MARKER}-{index}"} for index in range(3)]}
    results = run_orders(sasl_pipeline, [("o-secure", order)], sasl_options())
    assert [(result["correlation_id"], result["status"]) for result in results] == [("o-secure", "complete")]
    # the payload went through the worker (the item step returned it) ...
    assert sorted(item["result"]["value"] for item in results[0]["items"]) == [f"{PAYLOAD_MARKER}-{index}" for index in range(3)]
    # ... and its web views answer, read-only, on 127.0.0.1 only
    assert worker.process is not None
    assert listening_addresses(worker.process.pid, worker.web_port) == ["127.0.0.1"]
    url = f"http://127.0.0.1:{worker.web_port}/weir/tables/aggregates_done/"
    assert http(url, "GET") == 200
    assert http(url, "POST") == 405
    assert http(f"http://127.0.0.1:{worker.web_port}/weir/dead-letters/", "POST") == 405
    worker.stop()
    log = worker.log_text()
    assert "Worker ready" in log, "the log is the worker's own (at INFO level)"
    assert SECRET not in log, "the SASL password appears in the worker's log"
    assert PAYLOAD_MARKER not in log, "payload contents appear in the worker's log"


def test_wrong_or_missing_credentials_are_refused(sasl_broker: BrokerInstance) -> None:
    topic = f"refused-{uuid.uuid4().hex[:6]}"
    sent = asyncio.run(produce(sasl_broker.bootstrap, topic, [(b"k", b"with the right password")], client_options=sasl_options()))
    assert sent == 1
    for options in (sasl_options("wrong-password"), {"security_protocol": "PLAINTEXT"}):
        with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
            asyncio.run(asyncio.wait_for(produce(sasl_broker.bootstrap, topic, [(b"k", b"v")], client_options=options), 30))
    assert "Failed authentication" in sasl_broker.server_log(), "the broker saw (and refused) the wrong password"
    assert SECRET not in sasl_broker.server_log()


@pytest.mark.parametrize("command", ["shop.demo", "examples.split_aggregate"])
def test_a_demo_with_a_wrong_sasl_password_says_so_in_one_line(sasl_broker: BrokerInstance, tmp_path: Path, command: str) -> None:
    """Once 82 lines of stderr with three tracebacks; now one line naming the broker and the settings, and exit code 2."""
    (tmp_path / "screen.jsonl").write_text('{"order_id": "o-1"}\n')
    orders = tmp_path / "screen.jsonl" if command == "examples.split_aggregate" else tmp_path
    env = {
        **os.environ,
        **SASL_ENV,
        "WEIR_KAFKA_SASL_PASSWORD": "wrong-password",
        "KAFKA_BOOTSTRAP": sasl_broker.bootstrap,
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", command, "--orders", str(orders)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, f"rc={done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"the Kafka broker at {sasl_broker.bootstrap} refused user '{USER}' (SASL PLAIN)" in lines[0]
    assert "WEIR_KAFKA_SASL_PASSWORD" in lines[0]
    assert "wrong-password" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_the_sasl_broker_listens_on_127_0_0_1_only(sasl_broker: BrokerInstance) -> None:
    pid = int((sasl_broker.state_dir / "kafka.pid").read_text())
    assert listening_addresses(pid, sasl_broker.port) == ["127.0.0.1"]
    assert listening_addresses(pid, sasl_broker.controller_port) == ["127.0.0.1"]


# ----- TLS: SASL_SSL on a broker started with WEIR_KAFKA_TLS=1 WEIR_KAFKA_SASL=1 -----


@dataclass
class TlsBroker:
    """A local Kafka whose only client listener is SASL_SSL/PLAIN, and what its start printed."""

    broker: BrokerInstance
    start_output: str

    @property
    def tls_dir(self) -> Path:
        return self.broker.state_dir / "kafka" / "tls"

    @property
    def ca_file(self) -> Path:
        return self.tls_dir / "ca.pem"

    def keystore_password(self) -> str:
        return (self.tls_dir / "keystore.password").read_text().strip()


def tls_settings(ca_file: Path | None, password: str = SECRET) -> Settings:
    """weir's settings for the TLS broker: SASL_SSL as USER, trusting ``ca_file`` (None: only the system's CAs)."""
    return Settings(
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username=USER,
        kafka_sasl_password=password,
        kafka_ssl_cafile="" if ca_file is None else str(ca_file),
    )


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    """A third local Kafka (own state dir and ports, shared jars) with TLS: SASL_SSL/PLAIN, user weir, password SECRET."""
    broker = BrokerInstance(
        tmp_path_factory.mktemp("tls-broker"),
        extra_env={"WEIR_KAFKA_TLS": "1", "WEIR_KAFKA_SASL": "1", "WEIR_KAFKA_SASL_USERNAME": USER, "WEIR_KAFKA_SASL_PASSWORD": SECRET},
    )
    try:
        # inside the try: a start that fails half-way (Kafka up, not ready in time) is stopped too
        output = broker.run("start")
        yield TlsBroker(broker, output)
    finally:
        broker.stop()


def tls_handshake(port: int, context: ssl.SSLContext, server_hostname: str) -> dict[str, Any]:
    """The certificate the broker shows to a TLS client with ``context`` that asks for ``server_hostname``."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=20) as sock,
        context.wrap_socket(sock, server_hostname=server_hostname) as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        certificate = tls.getpeercert()
        assert certificate is not None
        return dict(certificate)


@pytest.fixture
def tls_pipeline(tls_broker: TlsBroker, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pipeline]:
    unique = uuid.uuid4().hex[:8]
    deployment = Pipeline(bootstrap=tls_broker.broker.bootstrap, tmp=tmp_path, prefix=f"x{unique}.", app_id=f"x{unique}")
    yield deployment
    deployment.stop_all()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for worker in deployment.workers:
            sys.stderr.write(f"\n----- {worker.log_path.name} (tail) -----\n{worker.log_text()[-6000:]}\n")


def test_a_worker_on_a_tls_broker_completes_orders(tls_broker: TlsBroker, tls_pipeline: Pipeline) -> None:
    options = tls_settings(tls_broker.ca_file).kafka_client_options()
    assert options["security_protocol"] == "SASL_SSL"
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    # exactly_once (the default): the worker's transaction markers go over the broker's TLS inter-broker listener
    worker = tls_pipeline.start_worker(
        "all",
        WEIR_KAFKA_SECURITY_PROTOCOL="SASL_SSL",
        WEIR_KAFKA_SASL_MECHANISM="PLAIN",
        WEIR_KAFKA_SASL_USERNAME=USER,
        WEIR_KAFKA_SASL_PASSWORD=SECRET,
        WEIR_KAFKA_SSL_CAFILE=tls_broker.ca_file,
    )
    worker.wait_ready(120)
    orders = [
        (f"o-tls-{n}", {"order_id": f"o-tls-{n}", "items": [{"value": f"{PAYLOAD_MARKER}-{n}-{i}"} for i in range(3)]}) for n in range(3)
    ]
    results = run_orders(tls_pipeline, orders, options)
    assert sorted((result["correlation_id"], result["status"]) for result in results) == [(f"o-tls-{n}", "complete") for n in range(3)]
    for result in results:
        n = result["correlation_id"].rsplit("-", 1)[1]
        assert sorted(item["result"]["value"] for item in result["items"]) == [f"{PAYLOAD_MARKER}-{n}-{i}" for i in range(3)]
    worker.stop()
    log = worker.log_text()
    assert "Worker ready" in log
    assert SECRET not in log, "the SASL password appears in the worker's log"
    assert tls_broker.keystore_password() not in log
    assert PAYLOAD_MARKER not in log, "payload contents appear in the worker's log"


def test_a_client_that_does_not_trust_the_ca_is_refused(tls_broker: TlsBroker, caplog: pytest.LogCaptureFixture) -> None:
    port = tls_broker.broker.port
    # no WEIR_KAFKA_SSL_CAFILE: weir's client trusts only the system's CAs, which did not sign the broker's certificate
    untrusting = tls_settings(None)
    context = untrusting.kafka_ssl_context()
    assert context is not None
    with pytest.raises(ssl.SSLCertVerificationError, match="CERTIFICATE_VERIFY_FAILED"):
        tls_handshake(port, context, "127.0.0.1")
    caplog.set_level(logging.ERROR, logger="aiokafka")
    topic = f"untrusted-{uuid.uuid4().hex[:6]}"
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        asyncio.run(
            asyncio.wait_for(
                produce(tls_broker.broker.bootstrap, topic, [(b"k", b"v")], client_options=untrusting.kafka_client_options()), 30
            )
        )
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text, "the client gave up for another reason than the certificate"
    # the right CA but another name than the certificate's: refused too (the name is checked, not just the signature)
    trusting = tls_settings(tls_broker.ca_file).kafka_ssl_context()
    assert trusting is not None
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        tls_handshake(port, trusting, "kafka.example.com")


def test_wrong_password_or_no_tls_is_refused_on_the_tls_broker(tls_broker: TlsBroker) -> None:
    bootstrap = tls_broker.broker.bootstrap
    topic = f"tls-refused-{uuid.uuid4().hex[:6]}"
    sent = asyncio.run(
        produce(
            bootstrap,
            topic,
            [(b"k", b"with the CA and the right password")],
            client_options=tls_settings(tls_broker.ca_file).kafka_client_options(),
        )
    )
    assert sent == 1
    refused_before = tls_broker.broker.server_log().count("Invalid username or password")
    wrong_password = tls_settings(tls_broker.ca_file, password="wrong-password").kafka_client_options()
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        asyncio.run(asyncio.wait_for(produce(bootstrap, topic, [(b"k", b"v")], client_options=wrong_password), 30))
    assert tls_broker.broker.server_log().count("Invalid username or password") > refused_before, (
        "the broker saw (and refused) the wrong password"
    )
    # the right user and password without TLS: the listener speaks only TLS
    for options in (sasl_options(), {"security_protocol": "PLAINTEXT"}):
        with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
            asyncio.run(asyncio.wait_for(produce(bootstrap, topic, [(b"k", b"v")], client_options=options), 30))
    server_log = tls_broker.broker.server_log()
    assert SECRET not in server_log
    assert tls_broker.keystore_password() not in server_log


def test_the_tls_broker_certificate_keys_and_listeners(tls_broker: TlsBroker) -> None:
    broker = tls_broker.broker
    # the start says where the CA certificate is
    assert str(tls_broker.ca_file) in tls_broker.start_output
    assert "SASL_SSL" in tls_broker.start_output
    # the certificate is for 127.0.0.1 and localhost, signed by ca.pem
    context = tls_settings(tls_broker.ca_file).kafka_ssl_context()
    assert context is not None
    for name in ("127.0.0.1", "localhost"):
        certificate = tls_handshake(broker.port, context, name)
        assert sorted(certificate["subjectAltName"]) == [("DNS", "localhost"), ("IP Address", "127.0.0.1")]
    # keys and passwords: the owner's only; no private key lies around (the CA's was deleted once it signed)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in tls_broker.tls_dir.iterdir()}
    assert modes["broker.p12"] == 0o600
    assert modes["keystore.password"] == 0o600
    assert stat.S_IMODE(tls_broker.tls_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((broker.state_dir / "kafka" / "server.properties").stat().st_mode) == 0o600
    assert not any("PRIVATE KEY" in path.read_text(errors="replace") for path in tls_broker.tls_dir.iterdir())
    password = tls_broker.keystore_password()
    assert len(password) >= 32
    for path in (broker.state_dir / "kafka").rglob("*"):
        if path.is_file() and path.stat().st_mode & 0o044:
            text = path.read_text(errors="replace")
            assert password not in text, f"{path} is readable by others and holds the keystore password"
            assert SECRET not in text, f"{path} is readable by others and holds the SASL password"
    # 127.0.0.1 only; the controller stays PLAINTEXT there
    pid = int((broker.state_dir / "kafka.pid").read_text())
    assert listening_addresses(pid, broker.port) == ["127.0.0.1"]
    assert listening_addresses(pid, broker.controller_port) == ["127.0.0.1"]
    config = (broker.state_dir / "kafka" / "server.properties").read_text()
    assert f"listeners=SASL_SSL://127.0.0.1:{broker.port},CONTROLLER://127.0.0.1:{broker.controller_port}\n" in config
    assert "inter.broker.listener.name=SASL_SSL\n" in config
    assert "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT\n" in config
