"""The application as an object: a weir worker built from a settings value and the user's code, passed as objects.

    application = weir.Application(weir.Settings(bootstrap="127.0.0.1:9092", agents=("flows",)), flows=myapp.flows.FLOWS)
    app = application.serve_agents()        # faust -A myapp.main worker

Constructing one does what a worker needs before Faust starts it, from the value given and nothing else: installs
the exactly-once engine with the settings' configuration and the worker's environment (the wall clock, the engine's
outlet: :mod:`app.runtime.environment`), builds the Faust application, its topics and tables, the read-only web
views and the metrics. :meth:`Application.serve_agents` then declares the stages of the agent sets the settings
name (``WEIR_AGENTS`` on the command line): weir's own (``splitter``, ``flows``, ``eof_controller``...: the
modules of :mod:`agents`, loaded by name) and the application's (``agent_sets``: a name and a function from the
application to its stages). The environment variables are read only by :meth:`Application.from_env`, which the
command lines call (``faust -A app.main worker``); it loads the user code they name (``WEIR_FLOWS``,
``WEIR_EOF_JOB``...) for the agents chosen, and hands it to the constructor as objects.

One application per process: the engine and the environment it installs are the process's.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

import faust
from aiokafka import AIOKafkaProducer
from faust.types import StreamT, TableT
from faust.types.auth import CredentialsT

from weir.app import collector, engine, metrics, web
from weir.app.codec import dumps
from weir.app.core import handle_parts, refuse_out_of_order_agents
from weir.app.edge import command_edge
from weir.app.eof_topology import load_job, parse_jobs
from weir.app.flow_topology import load_flows
from weir.app.flows import Flow
from weir.app.kafka_io import ensure_topics
from weir.app.pipeline import load_processor
from weir.app.runtime import environment
from weir.app.settings import AGENT_NAMES, OPTIONAL_AGENT_NAMES, SettingError, Settings
from weir.app.stages import Stage, Wiring
from weir.app.trigger_status import StatusSource, open_status_source
from weir.app.windows import Window, load_windows
from weir.tables.eof import EofJob

__all__ = ["Application", "AgentSet", "SignalSender", "Topics", "broker_credentials"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: An agent set: the stages one worker serves for a name ``WEIR_AGENTS`` takes, built on the application.
AgentSet = Callable[["Application"], Iterable[Stage]]


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


def faust_app(settings: Settings) -> faust.App:
    """The Faust application of a worker with ``settings``: weir's engine classes, RocksDB under the data directory."""
    (settings.data_dir / settings.group_id).mkdir(parents=True, exist_ok=True)
    return faust.App(
        settings.group_id,
        broker=f"kafka://{settings.bootstrap}",
        broker_credentials=broker_credentials(settings),
        store="rocksdb://",
        datadir=str(settings.data_dir / settings.group_id),
        processing_guarantee=settings.processing_guarantee,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        topic_allow_declare=True,
        broker_commit_interval=settings.commit_interval,
        producer_linger=settings.producer_linger_ms / 1000,
        broker_session_timeout=settings.session_timeout,
        broker_heartbeat_interval=settings.heartbeat_interval,
        broker_rebalance_timeout=settings.rebalance_timeout,
        consumer_auto_offset_reset="earliest",
        table_standby_replicas=settings.standby_replicas,
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


def raw_topic(app: faust.App, config: Settings, *names: str) -> faust.TopicT:
    """A channel of ``app`` over the weir topics ``names`` (full names): raw bytes, partitioned like every topic weir
    declares."""
    return app.topic(*names, partitions=config.partitions, config=config.topic_config(), key_serializer="raw", value_serializer="raw")


class Topics:
    """The topics weir's own agents read or write, named with the configured prefix, and those the stages declared."""

    def __init__(self, app: faust.App, config: Settings) -> None:
        def declare(name: str) -> faust.TopicT:
            return raw_topic(app, config, config.topic(name))

        self.orders = declare("orders")
        self.items = declare("items")
        self.item_results = declare("item-results")
        self.aggregates = declare("aggregates")
        self.dead_letters = declare("dead-letters")

        #: topics the stages declared (the flows' sources, resumes, outcomes, barriers...)
        self.extra: list[faust.TopicT] = []

    def all(self) -> list[faust.TopicT]:
        return [self.orders, self.items, self.item_results, self.aggregates, self.dead_letters, *self.extra]


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


class EngineOutlet:
    """A worker's outlet: the engine's producer, each record in the transaction of the event being handled
    (:func:`app.engine.send_record`); the dead letters to ``WEIR_TOPIC_PREFIX`` + ``dead-letters``."""

    def __init__(self, application: Application) -> None:
        self._application = application

    @property
    def dead_letters(self) -> faust.TopicT:
        return self._application.topics.dead_letters

    async def send(
        self, topic: Any, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]] | None, partition: int | None
    ) -> None:
        await engine.send_record(topic, key, value, headers, partition)

    def partitions(self, topic: str) -> int | None:
        return self._application.topic_partitions.get(topic)

    async def signal(self, topic: Any, value: bytes, partition: int) -> None:
        await self._application.signals.send(topic.get_topic_name(), value, partition)


def use_event_loop(name: str) -> None:
    """The event loop a worker started from the command line runs on: ``name`` ("uvloop" or "asyncio"), unless Faust's
    own ``FAUST_LOOP`` (or ``faust -L``) chose one as Faust was imported.

    Called while the entry module is imported by ``faust -A <module> worker``: Faust makes the worker's loop after
    that, from the policy set here (mode's ``loop.use``, as ``FAUST_LOOP`` does). Why asyncio stays the default:
    bench/changes.md (uvloop's A/B).
    """
    if name == "asyncio" or os.environ.get("FAUST_LOOP") or os.environ.get("F_LOOP"):
        return
    import mode.loop

    mode.loop.use(name)
    os.environ["FAUST_LOOP"] = name  # what Faust itself records; the worker's children and log see it


class Application:
    """A weir worker: its settings, the Faust application, the user's code, and the stages it serves.

    ``flows`` and ``windows``: what the ``flows`` and ``windows`` agents run; ``eof_jobs``: the end-of-stream jobs
    of the ``eof_*`` agents, by name (``""``: the unnamed job); ``item_processor``: the split/aggregate pipeline's
    item step (default: the settings' ``WEIR_ITEM_PROCESSOR``); ``trigger_status``: opens the children's status
    store the trigger's safety sweep reads (default: the settings' ``trigger_status_location``, the outbox's database
    unless named; ``lambda: None``: the sweep fires nothing); ``agent_sets``: the application's own
    agent sets, by the name ``WEIR_AGENTS`` takes; ``clock``: the time every stage reads and waits on (default: the
    machine's; the test driver runs the same stages on a virtual one).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        flows: Sequence[Flow] = (),
        windows: Sequence[Window] = (),
        eof_jobs: Mapping[str, EofJob] | None = None,
        item_processor: Callable[[Any], Any] | None = None,
        trigger_status: Callable[[], StatusSource | None] | None = None,
        agent_sets: Mapping[str, AgentSet] | None = None,
        clock: environment.Clock | None = None,
    ) -> None:
        self.settings = settings = settings if settings is not None else Settings()
        self.flows = list(flows)
        self.windows = list(windows)
        self.eof_jobs = dict(eof_jobs or {})
        self.item_processor = item_processor
        if trigger_status is None:
            location, query = settings.trigger_status_location, settings.trigger_status_query or None
            trigger_status = (lambda: open_status_source(location, query=query)) if location else (lambda: None)
        self.trigger_status = trigger_status
        self.agent_sets = dict(agent_sets or {})
        clashes = sorted(set(self.agent_sets) & set(AGENT_NAMES + OPTIONAL_AGENT_NAMES))
        if clashes:
            raise ValueError(f"agent sets {clashes}: names of weir's own agents")

        engine.install(
            engine.EngineConfig(
                worker_transaction=settings.worker_id if settings.transactions == "per_worker" else None,
                transaction_timeout_ms=settings.transaction_timeout_ms,
                static_member=settings.worker_id if settings.static_membership else None,
                commit_idle_s=settings.commit_idle_ms / 1000,
                fetch_max_wait_ms=settings.fetch_max_wait_ms,
                defer_deliveries=settings.processing_guarantee == "exactly_once",
                direct_batches=settings.direct_batches,
                record_batch_bytes=min(engine.EngineConfig.record_batch_bytes, settings.max_message_bytes - 1024),
                trace_file=settings.trace_file or None,
            )
        )
        #: the Faust application (``faust -A <module> worker`` finds it as the module's ``app``)
        self.app = app = faust_app(settings)
        self.topics = Topics(app, settings)
        #: partition counts of the topics, as the broker described them when this worker started
        self.topic_partitions: dict[str, int] = {}
        self.signals = SignalSender(settings.bootstrap, settings.kafka_client_options())
        environment.install(
            environment.Environment(
                clock=clock or environment.WallClock(),
                outlet=EngineOutlet(self),
                max_message_bytes=settings.max_message_bytes,
                # what the producer sends at most too, less 1 KiB (read once: Faust's settings are slow to read, every output is measured)
                record_limit=min(settings.max_message_bytes, app.conf.producer_max_request_size) - 1024,
            )
        )
        app.on_worker_init.connect(self._prepare_worker)
        app.on_before_shutdown.connect(self._stop_signals)
        app.task(_install_task_dump)
        metrics.install(app)
        web.install(app, settings=settings, topics=self.topics, topic_partitions=self.topic_partitions)
        collector.tune_collector(settings.gc_tuned)
        if settings.gc_tuned:
            app.task(_freeze_started)
        self._declared: dict[str, faust.TopicT] = {}
        self._shared: dict[str, Any] = {}

    @classmethod
    def from_env(cls, *, agent_sets: Mapping[str, AgentSet] | None = None, settings: Settings | None = None) -> Application:
        """The application the command line describes: the settings from the ``WEIR_*`` variables, and the user code
        they name (``WEIR_FLOWS``, ``WEIR_WINDOWS``, ``WEIR_EOF_JOB``, ``WEIR_ITEM_PROCESSOR``),
        loaded only for the agents ``WEIR_AGENTS`` chooses."""
        settings = settings if settings is not None else Settings.from_env()
        use_event_loop(settings.event_loop)
        chosen = set(settings.agents)
        jobs = parse_jobs(settings.eof_job) if chosen & EOF_AGENTS else []
        if chosen & EOF_AGENTS and not jobs:
            message = (
                "setting WEIR_EOF_JOB is not set: the eof_* agents run the end-of-stream job(s) it names, "
                "'module:NAME' of a tables.eof.EofJob, or 'name=module:NAME,...' for several (weir has no default job)"
            )
            raise SettingError(message)
        return cls(
            settings,
            flows=load_flows(settings.flows_module) if "flows" in chosen else (),
            windows=load_windows(settings.windows_module) if "windows" in chosen else (),
            eof_jobs={name: load_job(spec) for name, spec in jobs},
            item_processor=load_processor(settings.item_processor) if chosen & PIPELINE_AGENTS else None,
            agent_sets=agent_sets,
        )

    # ------------------------------------------------------------------ what a topology declares

    def topic(self, name: str) -> faust.TopicT:
        """A channel over the weir topic ``name`` (its full name): raw bytes, partitioned like every topic weir
        declares, created when the worker starts."""
        if name not in self._declared:
            self._declared[name] = raw_topic(self.app, self.settings, name)
            self.topics.extra.append(self._declared[name])
        return self._declared[name]

    def table(self, name: str, help_text: str) -> TableT[str, Any]:
        """A table with string keys and JSON values, partitioned like weir's topics.

        Its changelog is named with the topic prefix, not the consumer group, so the state does not depend
        on how stages are packed into processes.
        """
        settings = self.settings
        return self.app.Table(
            name,
            default=None,
            partitions=settings.partitions,
            schema=faust.Schema(key_serializer="json", value_serializer="json"),
            help=help_text,
            changelog_topic=self.app.topic(
                settings.topic(f"{name}-changelog"),
                partitions=settings.partitions,
                config=settings.topic_config(),
                compacting=True,
                key_serializer="json",
                value_serializer="json",
            ),
        )

    @functools.cached_property
    def wiring(self) -> Wiring:
        """This worker's wiring, one for all its topologies: its settings, topics and changelog-backed tables, its
        dead-letter topic."""
        return Wiring(settings=self.settings, topic=self.topic, table=self.table, dead_letters=self.topics.dead_letters)

    def shared(self, name: str, build: Callable[[], T]) -> T:
        """The object ``name`` of this application, built by ``build`` the first time: a topology that several agent
        sets serve stages of (the pipeline's splitter, items and aggregator) is built once per worker."""
        if name not in self._shared:
            self._shared[name] = build()
        return cast(T, self._shared[name])

    # ------------------------------------------------------------------ serving stages

    def serve(self, stages: Iterable[Stage]) -> None:
        """Declare each stage as a Faust agent (:func:`app.core.handle_parts` on its sources, in batches of its own size
        and wait), its ticks and its timers."""
        settings = self.settings
        for stage in stages:
            names = [topic.get_topic_name() for topic in stage.sources]
            channel = stage.sources[0] if len(names) == 1 else raw_topic(self.app, settings, *names)

            async def agent(stream: StreamT[bytes], stage: Stage = stage) -> None:
                await handle_parts(
                    stream,
                    stage.handle_part,
                    size=stage.batch_size or settings.batch_size,
                    wait_ms=stage.batch_wait_ms or settings.batch_wait_ms,
                    bounded=stage.runs_user_steps,
                    concurrent=stage.concurrent_parts,
                    crash=self.app.crash,
                )

            agent.__qualname__ = agent.__name__ = f"stage_{stage.name.replace('-', '_')}"
            self.app.agent(channel, name=stage.name)(agent)
            for topic in stage.ticked:
                self.tick_every(topic, stage.tick_every_ms, stage.tick_value)
            for timer in stage.timers:
                self.app.timer(interval=timer.every_s)(timer.run)

    def serve_agents(self, names: Iterable[str] | None = None) -> faust.App:
        """Serve the stages of the agent sets ``names`` (default: the settings' ``agents``, ``WEIR_AGENTS``); return the
        Faust application to run."""
        chosen = list(self.settings.agents if names is None else names)
        known = [*AGENT_NAMES, *OPTIONAL_AGENT_NAMES, *self.agent_sets]
        unknown = [name for name in chosen if name not in known]
        if unknown:
            message = f"unknown agent set(s) {unknown}: expected any of {known} (weir's own, then this application's agent_sets)"
            raise SettingError(message)
        for name in chosen:
            agent_set = self.agent_sets.get(name) or importlib.import_module(f"weir.agents.{name}").stages
            self.serve(agent_set(self))
        return self.app

    async def tick_owned(self, topic: faust.TopicT, value: Any = None) -> None:
        """Send ``value`` (default ``{"kind": "tick"}``) to each partition of ``topic`` this worker owns (handled in
        stream order). Tables can only change inside stream processing, so a timer never expires state itself."""
        name = topic.get_topic_name()
        encoded = dumps({"kind": "tick"} if value is None else value)
        try:
            for tp in self.app.consumer.assignment():
                if tp.topic == name:
                    await self.signals.send(name, encoded, tp.partition)
        except Exception as error:  # not assigned yet, or mid-rebalance: the next tick tries again
            log.debug("tick of %s skipped: %s", name, error)

    def tick_every(self, topic: faust.TopicT, interval_ms: int | None = None, value: Any = None) -> None:
        """A timer that ticks ``topic``'s owned partitions every ``interval_ms`` (default WEIR_TICK_INTERVAL_MS)."""

        async def tick() -> None:
            await self.tick_owned(topic, value)

        self.app.timer(interval=(interval_ms or self.settings.tick_interval_ms) / 1000)(tick)

    # ------------------------------------------------------------------ the worker's start and stop

    def _prepare_worker(self, sender: Any, /, *_: Any, signal: Any = None, **__: Any) -> None:
        settings = self.settings
        if settings.processing_guarantee == "exactly_once":
            refuse_out_of_order_agents(sender.agents.values())
            engine.wipe_local_tables(sender.conf.tabledir)
        # Faust creates only its internal topics; a source topic missing at subscription time would never
        # be assigned. The loop is not running yet here, so the admin call runs on a loop of its own.
        names = [topic.get_topic_name() for topic in self.topics.all()]
        failure: list[BaseException] = []

        async def create() -> dict[str, int]:
            return await ensure_topics(
                settings.bootstrap, names, settings.partitions, replication=settings.replication_factor, config=settings.topic_config()
            )

        def run() -> None:
            try:
                self.topic_partitions.update(asyncio.run(create()))
            except BaseException as error:
                failure.append(error)

        thread = threading.Thread(target=run, name="weir-create-topics")
        thread.start()
        thread.join()
        if failure:
            with command_edge("weir worker"):  # a factor the cluster cannot hold: one line, exit 2
                if isinstance(failure[0], SettingError):
                    raise failure[0]
            # a broker that cannot be reached now: one line, and exit code 1 (not 2): whatever runs the worker
            # (weir's Supervisor, a service manager) starts it again, and the broker may be back by then
            topics = ", ".join(sorted(set(names)))
            print(f"weir worker: could not create topics {topics} on {settings.bootstrap}: {failure[0]}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None

    async def _stop_signals(self, sender: Any, /, *_: Any, signal: Any = None, **__: Any) -> None:
        await self.signals.stop()


#: weir's agent sets that run the split/aggregate pipeline's item step, and those that run end-of-stream jobs
PIPELINE_AGENTS = frozenset({"splitter", "items", "aggregator"})
EOF_AGENTS = frozenset({"eof_filter", "eof_controller", "eof_aggregator", "eof_joiner"})


def dump_tasks(app: faust.App) -> None:
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


async def _install_task_dump(app: faust.App) -> None:
    import signal as signals_module

    asyncio.get_running_loop().add_signal_handler(signals_module.SIGUSR1, dump_tasks, app)


async def _freeze_started() -> None:
    """Once the worker started, its own objects leave the collector's walks (:mod:`app.collector`)."""
    collector.freeze_started()
