"""Security basics: a worker on a SASL/PLAIN broker, wrong credentials refused, local read-only web views, quiet logs."""

from __future__ import annotations

import asyncio
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaConnectionError

from app.kafka_io import produce, produce_json, read_topic
from app.processes import WorkerProcess
from tests.integration.conftest import Pipeline
from tests.integration.local_broker import BrokerInstance

pytestmark = pytest.mark.integration

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


def test_a_worker_on_a_sasl_broker_completes_an_order_and_logs_no_secret_or_payload(sasl_pipeline: Pipeline) -> None:
    worker = start_sasl_worker(sasl_pipeline)
    worker.wait_ready(120)
    order = {"order_id": "o-secure", "items": [{"value": f"{PAYLOAD_MARKER}-{index}"} for index in range(3)]}
    asyncio.run(produce_json(sasl_pipeline.bootstrap, sasl_pipeline.topic("orders"), [("o-secure", order)], client_options=sasl_options()))
    results = asyncio.run(
        read_topic(
            sasl_pipeline.bootstrap,
            sasl_pipeline.topic("aggregates"),
            until=lambda rows: len(rows) >= 1,
            timeout_s=90,
            decode=orjson.loads,
            client_options=sasl_options(),
        )
    )
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


def test_the_sasl_broker_listens_on_127_0_0_1_only(sasl_broker: BrokerInstance) -> None:
    pid = int((sasl_broker.state_dir / "kafka.pid").read_text())
    assert listening_addresses(pid, sasl_broker.port) == ["127.0.0.1"]
    assert listening_addresses(pid, sasl_broker.controller_port) == ["127.0.0.1"]
