"""The worker: its settings (from the environment variables, at import), the Faust application, its topics, and the
batch loop every agent runs. What a stage's code shares with the test driver is in :mod:`app.shell` (re-exported here)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

import faust
from aiokafka import AIOKafkaProducer
from faust.types import EventT, StreamT, TableT
from faust.types.auth import CredentialsT

from weir.app import engine, metrics
from weir.app.kafka_io import ensure_topics
from weir.app.runtime import environment
from weir.app.settings import Settings
from weir.app.shell import (
    DecodeError,
    EventHandler,
    OwedOutcome,
    all_at_once,
    dead_letter_key,
    dead_letter_value,
    dead_lettered,
    decode_event,
    handle_part_events,
    message_headers,
    now_ms,
    partitions_of,
    record_limit,
    redact_dead_letters,
    send_dead_letter,
    send_dead_letter_record,
)
from weir.app.split import InvalidMessage

__all__ = [
    "app",
    "settings",
    "topics",
    "signals",
    "json_table",
    "topic_partitions",
    "handle_events",
    "handle_parts",
    "run_parts",
    "Slicer",
    # re-exported from app.shell
    "now_ms",
    "message_headers",
    "decode_event",
    "EventHandler",
    "OwedOutcome",
    "handle_part_events",
    "dead_lettered",
    "all_at_once",
    "record_limit",
    "partitions_of",
    "dead_letter_key",
    "redact_dead_letters",
    "send_dead_letter_record",
    "dead_letter_value",
    "send_dead_letter",
    "InvalidMessage",
    "DecodeError",
]

log = logging.getLogger(__name__)

settings: Settings = Settings.from_env()
engine.install(
    engine.EngineConfig(
        worker_transaction=settings.worker_id if settings.transactions == "per_worker" else None,
        transaction_timeout_ms=settings.transaction_timeout_ms,
        static_member=settings.worker_id if settings.static_membership else None,
        commit_idle_s=settings.commit_idle_ms / 1000,
        defer_deliveries=settings.processing_guarantee == "exactly_once",
        direct_batches=settings.direct_batches,
        trace_file=settings.trace_file or None,
    )
)


def broker_credentials(config: Settings) -> CredentialsT | None:
    """Faust's credentials for ``WEIR_KAFKA_SECURITY_PROTOCOL`` (None: plaintext); the same as every other client's."""
    context = config.kafka_ssl_context()
    if config.kafka_security_protocol == "SSL":
        return faust.SSLCredentials(context)
    if config.kafka_security_protocol.startswith("SASL_"):
        # an ssl_context makes it SASL_SSL, none SASL_PLAINTEXT
        return faust.SASLCredentials(
            username=config.kafka_sasl_username,
            password=config.kafka_sasl_password,
            mechanism=config.kafka_sasl_mechanism,
            ssl_context=context,
        )
    return None


(settings.data_dir / settings.group_id).mkdir(parents=True, exist_ok=True)

app = faust.App(
    settings.group_id,
    broker=f"kafka://{settings.bootstrap}",
    broker_credentials=broker_credentials(settings),
    store="rocksdb://",
    datadir=str(settings.data_dir / settings.group_id),
    processing_guarantee=settings.processing_guarantee,
    topic_partitions=settings.partitions,
    topic_replication_factor=1,
    topic_allow_declare=True,
    broker_commit_interval=settings.commit_interval,
    producer_linger=settings.producer_linger_ms / 1000,
    broker_session_timeout=settings.session_timeout,
    broker_heartbeat_interval=settings.heartbeat_interval,
    broker_rebalance_timeout=settings.rebalance_timeout,
    consumer_auto_offset_reset="earliest",
    table_standby_replicas=0,
    web_host=settings.web_host,
    web_port=settings.web_port,
    web_bind=settings.web_host,
    # Faust's /table/<t>/<k>/ and /router/<t>/<k>/ route keys by Faust's partitioner, not weir's: app.web answers those paths instead
    web_tables_enabled=False,
    web_router_enabled=False,
    key_serializer="raw",
    value_serializer="raw",
    autodiscover=False,
    Table="weir.app.engine:WeirTable",
    Topic="weir.app.engine:WeirTopic",
)


def json_table(name: str, help_text: str) -> TableT[str, Any]:
    """A table with string keys and JSON values, partitioned like weir's topics.

    Its changelog is named with the topic prefix, not the consumer group, so the state does not depend
    on how stages are packed into processes.
    """
    return app.Table(
        name,
        default=None,
        partitions=settings.partitions,
        schema=faust.Schema(key_serializer="json", value_serializer="json"),
        help=help_text,
        changelog_topic=app.topic(
            settings.topic(f"{name}-changelog"),
            partitions=settings.partitions,
            compacting=True,
            key_serializer="json",
            value_serializer="json",
        ),
    )


class Topics:
    """Every topic weir's agents read or write, named with the configured prefix."""

    def __init__(self, faust_app: faust.App, config: Settings) -> None:
        def declare(name: str, *, compacting: bool = False) -> faust.TopicT:
            return faust_app.topic(
                config.topic(name),
                partitions=config.partitions,
                key_serializer="raw",
                value_serializer="raw",
                compacting=compacting or None,
            )

        self.orders = declare("orders")
        self.items = declare("items")
        self.item_results = declare("item-results")
        self.aggregates = declare("aggregates")
        self.dead_letters = declare("dead-letters")

        #: topics other modules declare (the flows' sources, resumes, outcomes, barriers)
        self.extra: list[faust.TopicT] = []

    def all(self) -> list[faust.TopicT]:
        return [self.orders, self.items, self.item_results, self.aggregates, self.dead_letters, *self.extra]


topics = Topics(app, settings)


#: Partition counts of weir's topics, as the broker described them when this worker started (``_prepare_worker``).
topic_partitions: dict[str, int] = {}


class EngineOutlet:
    """The worker's outlet: the engine's producer, each record in the transaction of the event being handled
    (:func:`app.engine.send_record`); the dead letters to ``WEIR_TOPIC_PREFIX`` + ``dead-letters``."""

    @property
    def dead_letters(self) -> faust.TopicT:
        return topics.dead_letters

    async def send(
        self, topic: Any, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]] | None, partition: int | None
    ) -> None:
        await engine.send_record(topic, key, value, headers, partition)

    def partitions(self, topic: str) -> int | None:
        return topic_partitions.get(topic)

    async def signal(self, topic: Any, value: bytes, partition: int) -> None:
        await signals.send(topic.get_topic_name(), value, partition)


environment.install(
    environment.Environment(
        clock=environment.WallClock(),
        outlet=EngineOutlet(),
        max_message_bytes=settings.max_message_bytes,
        # what the producer sends at most too, less 1 KiB (read once: Faust's settings are slow to read, every output is measured)
        record_limit=min(settings.max_message_bytes, app.conf.producer_max_request_size) - 1024,
    )
)


def refuse_out_of_order_agents(agents: Iterable[Any]) -> None:
    """Under exactly_once, stop a worker whose agent runs several actors (Faust's ``concurrency`` above 1).

    Such an agent takes a partition's events out of order, and no commit can then cover exactly the events
    whose outputs it carries (see :func:`run_parts`). An agent that waits on I/O runs its batch's events at
    once instead (:func:`handle_parts` and :func:`handle_part_events` with ``concurrent=True``). Under
    at_least_once a replay is allowed.
    """
    for agent in agents:
        if getattr(agent, "concurrency", 1) > 1:
            message = (
                f"agent {agent.name!r} runs {agent.concurrency} actors (concurrency={agent.concurrency}) under exactly_once: "
                "they would take a partition's events out of order, and a commit could carry outputs of events whose offsets "
                "it does not commit; use concurrency=1, and handle_parts(..., concurrent=True) with "
                "handle_part_events(..., concurrent=True) to run a batch's events at once"
            )
            raise RuntimeError(message)


@app.on_worker_init.connect
def _prepare_worker(sender: Any, /, *_: Any, signal: Any = None, **__: Any) -> None:
    if settings.processing_guarantee == "exactly_once":
        refuse_out_of_order_agents(sender.agents.values())
        engine.wipe_local_tables(sender.conf.tabledir)
    # Faust creates only its internal topics; a source topic missing at subscription time would never
    # be assigned. The loop is not running yet here, so the admin call runs on a loop of its own.
    names = [topic.get_topic_name() for topic in topics.all()]
    failure: list[BaseException] = []

    def create() -> None:
        try:
            topic_partitions.update(asyncio.run(ensure_topics(settings.bootstrap, names, settings.partitions)))
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=create, name="weir-create-topics")
    thread.start()
    thread.join()
    if failure:
        message = f"weir: could not create topics {names} on {settings.bootstrap}: {failure[0]}"
        raise RuntimeError(message) from failure[0]


class SignalSender:
    """Sends control signals (ticks) with a plain producer, outside any transaction.

    A tick sent inside the exactly_once transaction of the partition it targets would only become
    visible when that transaction commits, which happens when the partition processes a record: an idle
    partition would never see its ticks, and its deadlines would never fire. Ticks carry no data and
    are idempotent, so they need no transaction.
    """

    def __init__(self, bootstrap: str, client_options: dict[str, Any] | None = None) -> None:
        self._bootstrap = bootstrap
        self._client_options = client_options or {}
        self._producer: AIOKafkaProducer | None = None

    async def send(self, topic: str, value: bytes, partition: int) -> None:
        if self._producer is None:
            self._producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap, acks=1, linger_ms=0, **self._client_options)
            await self._producer.start()
        await self._producer.send(topic, value=value, partition=partition)

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


signals = SignalSender(settings.bootstrap, settings.kafka_client_options())


@app.on_before_shutdown.connect
async def _stop_signals(sender: Any, /, *_: Any, signal: Any = None, **__: Any) -> None:
    await signals.stop()


def dump_tasks(*_: Any) -> None:
    """Log what every asyncio task of this worker waits on, down its await chain (``kill -USR1 <pid>``)."""
    lines = []
    for task in asyncio.all_tasks():
        lines.append(f"--- {task.get_name()}")
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            else:
                lines.append(f"    awaiting {awaited!r:.200}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None) or getattr(awaited, "gi_yieldfrom", None)
    lines.extend(engine.describe_consumer(app))
    log.warning("asyncio tasks:\n%s", "\n".join(lines))


async def _install_task_dump() -> None:
    import signal as signals_module

    asyncio.get_running_loop().add_signal_handler(signals_module.SIGUSR1, dump_tasks)


app.task(_install_task_dump)


async def handle_events(
    stream: StreamT[bytes], *, agent: str, what: str, handler: EventHandler, owed: OwedOutcome | None = None, runs_user_steps: bool = False
) -> None:
    """The loop every agent runs: decode each event, hand it to ``handler``, dead-letter what fails.

    Undecodable and schema-invalid messages go to the dead letters at once; any other error escaping the
    handler (a bug, not bad input: user steps have their own retry policy) is dead-lettered too, so the
    agent keeps running and the partition is not blocked. Events are taken in batches (:func:`handle_parts`)
    and handled in offset order, one scope per partition's part of a batch: its table writes are written
    once per key, and a commit comes between two slices of a batch (:class:`Slicer`), never inside an
    event. A handler that waits on I/O runs a batch's events at once with :func:`handle_parts` and
    :func:`handle_part_events`, both ``concurrent=True`` (the items agent). ``owed``: the agent owes an
    outcome for every input; it is sent for an input that failed, after its dead letter (:func:`dead_lettered`).
    ``runs_user_steps``: the handler runs the user's steps, whose time can jump (a service that slows down, retries
    with backoff): slices of one event, a commit possible after each, so that a slice sized at the fast pace
    cannot hold hundreds of suddenly slow events in one transaction, past its timeout.
    """

    async def each(part: Sequence[EventT[bytes]]) -> None:
        await handle_part_events(part, agent=agent, what=what, handler=handler, owed=owed)

    await handle_parts(stream, each, slice_most=1 if runs_user_steps else None)


PartHandler = Callable[[Sequence[EventT[bytes]]], Awaitable[None]]


async def handle_parts(
    stream: StreamT[bytes],
    handle_part: PartHandler,
    *,
    size: int | None = None,
    wait_ms: int | None = None,
    concurrent: bool = False,
    slice_most: int | None = None,
) -> None:
    """Take events in batches (:func:`take_batches`: up to ``size``, what is ready) and run them (:func:`run_sliced`),
    in slices of at most ``slice_most`` events (default: ``size``)."""
    slicer = Slicer(slice_most or size or settings.batch_size)
    async with worker_stops_on_escape():
        async for batch in take_batches(stream, size or settings.batch_size, (wait_ms or settings.batch_wait_ms) / 1000):
            await run_sliced(batch, handle_part, slicer, concurrent=concurrent)


@contextlib.asynccontextmanager
async def worker_stops_on_escape() -> AsyncIterator[None]:
    """An error that escapes an agent's loop stops the worker (it is not bad input: that is dead-lettered).

    Only a refused output (:class:`app.errors.OutputFailed`) or a bug in weir escapes. Faust's supervisor would
    restart the agent's actor, and the batch it held would be neither handled nor delivered again while the
    worker runs: the partitions' committed offsets would stop below it for good, while the events after it
    committed their outputs (sent again after the next restart). A restarted worker reads the batch again
    from the committed offset, on tables rebuilt from the changelog.
    """
    try:
        yield
    except Exception as error:
        # The failed part's sends are in the open transaction without its offsets: nothing may commit now.
        engine.gate.refuse(f"an error escaped an agent's loop: {error!r}")
        log.error("an error escaped an agent's loop, the worker stops: %r", error)
        await app.crash(error)
        raise


#: How long one slice of a batch may run before a commit due may go: well under the transaction timeout.
SLICE_BUDGET_S = 1.0


class Slicer:
    """How many events of a batch go in one :func:`run_parts` call: as many as run in about ``budget_s``.

    A batch runs between two commits, so under exactly_once inside one transaction: a batch of 500 orders
    whose item steps take 100 ms each would keep it open 50 s, past the transaction timeout (the broker
    aborts it and fences the worker, which then crash-loops on the same batch). Slices start at
    ``first`` events and follow the last slice's time per event, between 1 and ``most``, growing at most twofold
    from one slice to the next. The first slice is one event: a worker that starts on a backlog of heavy events
    (bundles of 50 item messages whose steps take 2.5 s each) would otherwise take 50 of them in its first
    transaction, past the timeout; a fast stream still reaches ``most`` within ten slices.

    Only events that ran count: events skipped without running (of an older consumer generation, or taken
    while a rebalance holds the gate) take no time, and counting them once sized the next slice at 500 orders
    of 110 ms each, 55 s in one transaction: the inline splitter that took over a killed worker's partitions
    was fenced and crashed.
    """

    def __init__(self, most: int, *, first: int = 1, budget_s: float | None = None) -> None:
        self.most = max(1, most)
        self.size = min(self.most, first)
        self.budget_s = SLICE_BUDGET_S if budget_s is None else budget_s

    def took(self, events: int, seconds: float) -> None:
        """``events`` ran in ``seconds``: the next slice is as many as fit the budget at that pace (at most twice
        this one). A slice in which no event ran says nothing about the pace and changes nothing."""
        if events <= 0:
            return
        fits = int(events * self.budget_s / seconds) if seconds > 0 else self.most
        self.size = max(1, min(self.most, fits, 2 * max(self.size, events)))


async def run_sliced(events: Sequence[EventT[bytes]], handle_part: PartHandler, slicer: Slicer, *, concurrent: bool = False) -> None:
    """Run a batch with :func:`run_parts`, in slices (:class:`Slicer`), letting a commit that is due go between them.

    The slices follow the batch's delivery order, so each partition's handled (acked) events are still a
    prefix of what it delivered when a commit comes between two slices: the commit covers them, and the
    events of later slices, not yet acked, are left for the next one.
    """
    rest = list(events)
    while rest:
        piece, rest = rest[: slicer.size], rest[slicer.size :]
        began = time.monotonic()
        ran = await run_parts(piece, handle_part, concurrent=concurrent)
        slicer.took(ran, time.monotonic() - began)
        if rest:
            await asyncio.sleep(0)  # the commit handler, woken by the idle gate, may close it now


def take_batches(stream: StreamT[bytes], max_: int, within: float) -> AsyncIterator[list[EventT[bytes]]]:
    """An agent's batches: up to ``max_`` events, each handed on as soon as no further event is ready. Events are
    not acked here: the caller acks them inside their exactly-once scope. With ``WEIR_DIRECT_BATCHES`` (the
    default) they come from the agent's inbox, straight from the consumer's delivery loop; else from Faust's
    stream (``within`` bounds how long it sleeps between looks): :func:`app.engine.streams.batches`.
    """
    return engine.batches(stream, max_, within)


async def run_parts(events: Sequence[EventT[bytes]], handle_part: PartHandler, *, concurrent: bool = False) -> int:
    """Hand a batch to ``handle_part`` by source partition, each partition's part inside one exactly-once scope;
    return how many events ran (the others were skipped: see below).

    No commit can start while a batch is handled. While a partition's part is handled Faust's current event
    is the part's last event (tables use that partition's store and changelog, sends join the transaction
    that commits that partition's offsets: the worker's one, or the partition's own under per_partition)
    and each table key is written once (``engine.part_scope``). Every event of the batch is acked before the
    batch leaves the commit gate, and every send and changelog write of it is delivered before a commit
    covers it (by the batch under at_least_once, by the next commit under exactly_once:
    ``engine.batch_scope``), so the commit that covers one of its offsets covers all of them and all they wrote
    and sent. Events of an older consumer generation are acked without processing, as Faust's own stream
    does: the partition's new owner gets them again from the committed offset. ``concurrent``: the parts
    are handled at once, each in a task of its own (its own part scope).

    A partition's events are handled in offset order, in one batch at a time: when a commit closes the gate,
    every event this agent took is either handled and acked or not begun, and the acked offsets of each
    partition are a prefix of what was delivered. That is why an agent must run one actor (Faust's
    ``concurrency=1``, :func:`refuse_out_of_order_agents`): several actors take one partition's events out
    of order, and a commit would carry the outputs of handled events above one still waiting at the gate
    while committing the offsets only below it; a crash then replays them.
    """
    began = time.monotonic()
    async with engine.batch_scope() as scope:
        entered = time.monotonic()
        # Inside the commit gate: no commit runs meanwhile, and a rebalance that began is seen (engine.to_process).
        parts: dict[Any, list[EventT[bytes]]] = {}
        for event in events:
            engine.trace("event", event.message.tp, event.message.offset)
            if engine.to_process(event):
                parts.setdefault(event.message.tp, []).append(event)

        async def run(part: list[EventT[bytes]]) -> None:
            async with scope.part(part[-1]):
                await handle_part(part)
            engine.ack_handled_all(part)

        if concurrent and len(parts) > 1:
            await all_at_once(run(part) for part in parts.values())
        else:
            for part in parts.values():
                await run(part)
    metrics.batch_handled(parts)
    if events and engine.tracing():  # the batch's size, its wait at the gate and its time inside
        took = f"{1000 * (entered - began):.1f}-{1000 * (time.monotonic() - entered):.1f}ms"
        engine.trace(f"batch-{len(events)}-{took}", events[-1].message.tp, events[-1].message.offset)
    return sum(len(part) for part in parts.values())


__all__ += ["Topics"]
