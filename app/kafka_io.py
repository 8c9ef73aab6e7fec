"""Plain aiokafka helpers for what stands outside the workers: feeding input, reading outputs (demo, tests, bench)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.partitioner import murmur2

from weir.app.codec import dumps
from weir.app.settings import SettingError, kafka_client_options

__all__ = [
    "produce",
    "produce_everywhere",
    "produce_json",
    "read_topic",
    "read_to_end",
    "ensure_topics",
    "client_options_or_env",
    "ReplyDesk",
    "delete_topics",
    "BrokerUnavailable",
    "check_broker",
    "groups_reading",
]

#: What a broker answers when it refuses the client's SASL user, password or mechanism.
AUTHENTICATION_ERRORS = (
    SaslAuthenticationFailed,
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    UnsupportedSaslMechanismError,
)
SASL_SETTINGS = "WEIR_KAFKA_SASL_USERNAME, WEIR_KAFKA_SASL_PASSWORD and WEIR_KAFKA_SASL_MECHANISM"


def client_options_or_env(client_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``client_options`` as given, or the security options of the environment (``WEIR_KAFKA_SECURITY_PROTOCOL`` ...).

    Every helper takes an explicit bootstrap; its client options default to the environment's so that a
    SASL or TLS deployment needs no change in the callers.
    """
    return dict(client_options) if client_options is not None else kafka_client_options()


class BrokerUnavailable(Exception):
    """The broker cannot be used at all: unreachable, or it refused the client. The message is one line for a person."""


class _Failures(logging.Handler):
    """aiokafka's own reasons for a failed bootstrap (it logs each host's error, then raises a generic one)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.errors: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.errors.extend(arg for arg in record.args or () if isinstance(arg, BaseException))


async def _reachable(address: str, timeout_s: float) -> str | None:
    """None when a TCP connection to ``host:port`` opens, else why not."""
    host, _, port = address.strip().rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout_s)
    except TimeoutError:
        return f"no answer within {timeout_s:g}s"
    except ConnectionRefusedError:
        return "connection refused"
    except (OSError, ValueError) as error:
        return getattr(error, "strerror", None) or str(error)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


def _refused(bootstrap: str, options: Mapping[str, Any], cause: BaseException | None) -> str:
    protocol = options.get("security_protocol", "PLAINTEXT")
    if isinstance(cause, AUTHENTICATION_ERRORS):
        user = options.get("sasl_plain_username")
        return f"the Kafka broker at {bootstrap} refused user {user!r} (SASL {options.get('sasl_mechanism')}): check {SASL_SETTINGS}"
    if isinstance(cause, ssl.SSLError):
        tls_settings = "WEIR_KAFKA_SSL_CAFILE and WEIR_KAFKA_SECURITY_PROTOCOL"
        return f"TLS with the Kafka broker at {bootstrap} failed ({cause.reason or cause}): check {tls_settings}"
    why = f" ({str(cause)[:120]})" if cause is not None else ""
    return (
        f"the Kafka broker at {bootstrap} accepts connections but not this client{why}: check WEIR_KAFKA_SECURITY_PROTOCOL "
        f"(now {protocol}) and, for SASL, {SASL_SETTINGS}"
    )


async def check_broker(bootstrap: str, *, client_options: Mapping[str, Any] | None = None, timeout_s: float = 15.0) -> None:
    """Raise :class:`BrokerUnavailable` with one line naming the cause and the setting to check, when the broker at
    ``bootstrap`` cannot be reached or refuses the client (wrong SASL password, TLS, protocol). Commands call this
    before they start workers, which would otherwise each fail with tracebacks."""
    addresses = [address for address in bootstrap.split(",") if address.strip()]
    unreachable = [(address, await _reachable(address, min(timeout_s, 5.0))) for address in addresses]
    if addresses and all(why is not None for _, why in unreachable):
        causes = "; ".join(f"{address.strip()}: {why}" for address, why in unreachable)
        message = (
            f"cannot reach the Kafka broker at {bootstrap} ({causes}): check KAFKA_BOOTSTRAP (or WEIR_KAFKA_PORT) and that the broker runs"
        )
        raise BrokerUnavailable(message)
    options = client_options_or_env(client_options)
    failures = _Failures()
    quiet = logging.getLogger("aiokafka")  # its per-host errors are the cause below, not lines of their own on stderr
    propagate = quiet.propagate
    quiet.addHandler(failures)
    quiet.propagate = False
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000), **options)
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except Exception as error:  # aiokafka says "Unable to bootstrap"; the reason is what it logged per host
        cause = next((found for found in reversed(failures.errors) if isinstance(found, AUTHENTICATION_ERRORS)), None)
        raise BrokerUnavailable(_refused(bootstrap, options, cause or (failures.errors or [error])[-1])) from error
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
        quiet.removeHandler(failures)
        quiet.propagate = propagate


async def _refuse_replication_beyond(admin: AIOKafkaAdminClient, bootstrap: str, factor: int, names: list[str]) -> None:
    """Refuse (:class:`app.settings.SettingError`, one line) to create ``names`` with more copies than live brokers:
    Kafka would refuse each topic. Asked only when topics are to be created: a broker down for a while must not
    stop a worker whose topics exist (a restart during a broker's outage went on refusing)."""
    brokers = len((await admin.describe_cluster())["brokers"])
    if brokers < factor:
        message = (
            f"setting WEIR_REPLICATION_FACTOR={factor}: the cluster at {bootstrap} has only {brokers} live broker(s) "
            f"to create {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
        )
        raise SettingError(message)


async def groups_reading(bootstrap: str, topic: str, *, client_options: Mapping[str, Any] | None = None) -> list[str] | None:
    """The consumer groups that have committed offsets on ``topic`` (the stages reading it), or None when the broker
    has no such topic. Asking creates nothing (a producer's first send would auto-create a mistyped topic)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_options_or_env(client_options))
    await admin.start()
    try:
        if topic not in set(await admin.list_topics()):
            return None
        groups = [group for group, _ in await admin.list_consumer_groups()]
        offsets = await asyncio.gather(*(admin.list_consumer_group_offsets(group) for group in groups))
        return sorted(group for group, committed in zip(groups, offsets, strict=True) if any(tp.topic == topic for tp in committed))
    finally:
        await admin.close()


#: CreateTopics' error code for a topic that exists (another worker created it meanwhile).
TOPIC_ALREADY_EXISTS = 36


def key_partition(key: bytes, partitions: int) -> int:
    """The partition of a keyed record: the producers' default partitioner (murmur2 of the key's bytes)."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


async def ensure_topics(
    bootstrap: str,
    names: Iterable[str],
    partitions: int,
    *,
    timeout_s: float = 30.0,
    client_options: Mapping[str, Any] | None = None,
    replication: int = 1,
    config: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """Create the topics that do not exist yet (``replication`` copies each, topic ``config``), wait until the broker
    lists them; their partition counts.

    A consumer that subscribes before its topics are in the broker's metadata is assigned nothing and
    only notices them minutes later (a just-started broker is slow to show new topics).
    """
    # once each: a request naming a topic twice is refused for that topic, and the broker's auto-creation (on
    # the metadata request below) then made it without the replication and config asked for
    wanted = list(dict.fromkeys(names))
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_options_or_env(client_options))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [NewTopic(name, partitions, replication, topic_configs=dict(config or {})) for name in wanted if name not in existing]
        if missing and replication > 1:
            await _refuse_replication_beyond(admin, bootstrap, replication, [topic.name for topic in missing])
        if missing:
            try:
                response = await admin.create_topics(missing)
            except Exception as error:  # created meanwhile by a worker: fine
                if "TopicAlreadyExists" not in type(error).__name__ + str(error):
                    raise
            else:
                refused = [entry for entry in response.topic_errors if entry[1] not in (0, TOPIC_ALREADY_EXISTS)]
                if refused:
                    details = "; ".join(f"{entry[0]}: error {entry[1]} {entry[2] if len(entry) > 2 else ''}".strip() for entry in refused)
                    message = f"the broker at {bootstrap} refused to create {details}"
                    raise RuntimeError(message)
        deadline = time.monotonic() + timeout_s
        while True:
            described = await admin.describe_topics(wanted)
            ready = {entry["topic"] for entry in described if entry.get("error_code", 0) == 0 and entry.get("partitions")}
            if ready >= set(wanted):
                return {entry["topic"]: len(entry["partitions"]) for entry in described if entry["topic"] in ready}
            if time.monotonic() > deadline:
                message = f"topics {sorted(set(wanted) - ready)} not visible on {bootstrap} after {timeout_s}s"
                raise TimeoutError(message)
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    *,
    partition: int | None = None,
    client_options: Mapping[str, Any] | None = None,
) -> int:
    """Send raw (key, value) records, waiting until the broker has all of them; returns how many."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5, **client_options_or_env(client_options))
    try:
        await producer.start()
    except BaseException:  # refused (credentials) or unreachable: close what start opened
        await producer.stop()
        raise
    count = 0
    try:
        pending = []
        for key, value in records:
            pending.append(await producer.send(topic, value=value, key=key, partition=partition))
            count += 1
        await producer.flush()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return count


async def produce_everywhere(bootstrap: str, topic: str, value: bytes, *, client_options: Mapping[str, Any] | None = None) -> int:
    """Send ``value`` (no key) once to every partition of an existing ``topic``; returns how many partitions."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, **client_options_or_env(client_options))
    try:
        await producer.start()
        partitions = sorted(await producer.partitions_for(topic))
        sent = [await producer.send(topic, value=value, partition=partition) for partition in partitions]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return len(partitions)


async def produce_json(
    bootstrap: str, topic: str, records: Iterable[tuple[str, Any]], *, client_options: Mapping[str, Any] | None = None
) -> int:
    return await produce(bootstrap, topic, ((key.encode(), dumps(value)) for key, value in records), client_options=client_options)


def _topic_reader(bootstrap: str, topic: str, read_committed: bool, client_options: Mapping[str, Any] | None) -> AIOKafkaConsumer:
    """A consumer of every partition of ``topic`` from its beginning, in no group (read_committed unless told)."""
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed" if read_committed else "read_uncommitted",
        group_id=None,
        **client_options_or_env(client_options),
    )


async def read_topic(
    bootstrap: str,
    topic: str,
    *,
    until: Callable[[list[Any]], bool],
    timeout_s: float,
    decode: Callable[[bytes], Any] | None = None,
    read_committed: bool = True,
    client_options: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Read ``topic`` from the beginning (read_committed) until ``until(records)`` holds or the timeout passes."""
    consumer = _topic_reader(bootstrap, topic, read_committed, client_options)
    await consumer.start()
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while not until(records) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for messages in batch.values():
                for message in messages:
                    records.append(decode(message.value) if decode and message.value is not None else message)
    finally:
        await consumer.stop()
    return records


async def read_to_end(
    bootstrap: str,
    topic: str,
    *,
    timeout_s: float = 30.0,
    decode: Callable[[bytes], Any] | None = None,
    read_committed: bool = True,
    client_options: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Every record of ``topic`` up to its end as of the call (read_committed: its last stable offset): a read of
    what is there that ends when it has read it, not after a quiet period. Raises TimeoutError past ``timeout_s``."""
    consumer = _topic_reader(bootstrap, topic, read_committed, client_options)
    await consumer.start()
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while not consumer.assignment():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: no partition assigned in {timeout_s} s")
            await asyncio.sleep(0.05)
        ends = await consumer.end_offsets(list(consumer.assignment()))
        left = {partition for partition, end in ends.items() if end > 0}
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: not read to its end in {timeout_s} s ({len(records)} records)")
            batch = await consumer.getmany(*left, timeout_ms=200)
            for messages in batch.values():
                records.extend(decode(message.value) if decode and message.value is not None else message for message in messages)
            left = {partition for partition in left if await consumer.position(partition) < ends[partition]}
    finally:
        await consumer.stop()
    return records


async def delete_topics(bootstrap: str, marker: str, *, client_options: Mapping[str, Any] | None = None) -> int:
    """Delete every topic whose name holds ``marker`` (a run's or a test's id); how many there were.

    A broker that serves many runs keeps every partition's files open: without this, test and bench
    topics pile up to the broker's open-file limit ("Too many open files").
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_options_or_env(client_options))
    await admin.start()
    try:
        names = [name for name in await admin.list_topics() if marker in name]
        if names:
            await admin.delete_topics(names)
        return len(names)
    finally:
        await admin.close()


#: What a reply desk files a record under (None: not a reply, ignored), and the value it hands over.
ReplyKey = Callable[[Any], "tuple[str, Any] | None"]


class ReplyDesk:
    """A producer, and a read_committed reader of reply topics from their end that hands each reply to its waiter.

    The demo's screens and the EOF gateway send requests and wait for keyed replies: ``key_of(record)``
    says under which key a record is filed (and its value), :meth:`expect` registers a waiter before the
    request is sent, :meth:`wait` returns the reply (a reply that came before anyone waited is kept; the
    last one for a key wins). Replies are read from the end of the topics as they were at :meth:`start`.
    """

    def __init__(self, bootstrap: str, key_of: ReplyKey, *, linger_ms: int = 0, client_options: Mapping[str, Any] | None = None) -> None:
        self._bootstrap = bootstrap
        self._key_of = key_of
        self._linger_ms = linger_ms
        #: security options of every client (default: the environment's WEIR_KAFKA_* settings)
        self.client_options = client_options_or_env(client_options)
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._arrived: dict[str, Any] = {}

    @property
    def producer(self) -> AIOKafkaProducer:
        assert self._producer is not None, "start() first"
        return self._producer

    async def start(self, topics: Iterable[str], partitions: int, replies: Iterable[str]) -> None:
        """Create ``topics`` if missing, then read ``replies`` (some of them) from their current end."""
        counts = await ensure_topics(self._bootstrap, topics, partitions, client_options=self.client_options)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self._bootstrap, enable_idempotence=True, acks="all", linger_ms=self._linger_ms, **self.client_options
        )
        await self._producer.start()
        # read_committed: a reply inside a transaction that later aborts is never seen
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            **self.client_options,
        )
        await self._consumer.start()
        partitions_read = [TopicPartition(name, number) for name in replies for number in range(counts[name])]
        self._consumer.assign(partitions_read)
        # replies to requests sent from now on only: the position is fixed before anything is sent
        await self._consumer.seek_to_end(*partitions_read)
        for partition in partitions_read:
            await self._consumer.position(partition)
        self._reader = asyncio.create_task(self._read(), name="reply-desk")

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        for client in (self._consumer, self._producer):
            if client is not None:
                await client.stop()

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            batch = await self._consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for record in records:
                    filed = self._key_of(record)
                    if filed is None:
                        continue
                    key, value = filed
                    # the waiter stays registered until wait() has it: a reply faster than the call to
                    # wait() must not leave it waiting on a new future
                    waiter = self._waiting.get(key)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(value)
                    else:
                        self._arrived[key] = value

    def expect(self, key: str) -> None:
        """Register a waiter for ``key`` before sending what it answers (so the reply cannot slip by)."""
        if key not in self._arrived:
            self._waiting.setdefault(key, asyncio.get_running_loop().create_future())

    async def wait(self, key: str, timeout_s: float) -> Any:
        """The reply filed under ``key``; TimeoutError after ``timeout_s``."""
        if key in self._arrived:
            self._waiting.pop(key, None)
            return self._arrived.pop(key)
        waiter = self._waiting.setdefault(key, asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(waiter, timeout_s)
        finally:
            self._waiting.pop(key, None)
