"""Every setting of weir, read once from environment variables with documented defaults."""

from __future__ import annotations

import importlib
import os
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from weir.app.errors import RetryPolicy

__all__ = [
    "Settings",
    "SettingError",
    "load_settings",
    "load_named",
    "load_declarations",
    "default_bootstrap",
    "default_postgres_url",
    "kafka_client_options",
    "AGENT_NAMES",
    "OPTIONAL_AGENT_NAMES",
    "SECURITY_PROTOCOLS",
    "SASL_MECHANISMS",
]


class SettingError(ValueError):
    """A setting (a ``WEIR_*`` variable, a command's argument) that cannot be used, said in one line naming it.

    Commands report it at their edge (:func:`app.processes.command_edge`) with a non-zero exit, no traceback.
    """


#: The agents a worker can run; ``WEIR_AGENTS`` picks a subset (default: all of them).
AGENT_NAMES: tuple[str, ...] = ("splitter", "items", "aggregator")
#: Agent sets that run only when named: "flows" runs the flows (and their barriers) of ``WEIR_FLOWS``;
#: "eof_filter", "eof_controller", "eof_aggregator", "eof_joiner" are the end-of-stream pipeline (agents/eof_*.py);
#: "triggers" is the counter trigger and its safety sweep (agents/triggers.py); "windows" the windowed aggregations of
#: ``WEIR_WINDOWS`` (agents/windows.py).
OPTIONAL_AGENT_NAMES: tuple[str, ...] = (
    "flows",
    "windows",
    "eof_filter",
    "eof_controller",
    "eof_aggregator",
    "eof_joiner",
    "triggers",
)
_PROJECT_ROOT = Path(__file__).resolve().parent.parent

#: WEIR_KAFKA_SECURITY_PROTOCOL values (Kafka's names for a listener's security protocol).
SECURITY_PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL")
#: WEIR_KAFKA_SASL_MECHANISM values (those aiokafka and Faust's SASLCredentials support with a user and password).
SASL_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _env_int(name: str, default: int, minimum: int | None = None, maximum: int | None = None) -> int:
    """The integer setting ``name`` (default when unset), refused in one line when it is no integer or out of range."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        message = f"setting {name}={raw!r}: expected an integer"
        raise SettingError(message) from None
    _in_range(name, raw, value, minimum, maximum)
    return value


def _env_float(name: str, default: float, minimum: float | None = None) -> float:
    """The number setting ``name`` (default when unset), refused in one line when it is no number or below ``minimum``."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        message = f"setting {name}={raw!r}: expected a number"
        raise SettingError(message) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SettingError(f"setting {name}={raw!r}: expected a finite number")
    _in_range(name, raw, value, minimum, None)
    return value


def _in_range(name: str, raw: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise SettingError(f"setting {name}={raw!r}: must be at least {minimum:g}")
    if maximum is not None and value > maximum:
        raise SettingError(f"setting {name}={raw!r}: must be at most {maximum:g}")


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    message = f"setting {name}={raw!r}: expected 1/true/yes/on or 0/false/no/off"
    raise SettingError(message)


def default_bootstrap() -> str:
    """The broker: ``KAFKA_BOOTSTRAP`` if set, else the local one on ``WEIR_KAFKA_PORT`` (19092), as scripts/broker.sh starts it."""
    return _env_str("KAFKA_BOOTSTRAP", f"127.0.0.1:{_env_str('WEIR_KAFKA_PORT', '19092')}")


def default_postgres_url() -> str:
    """The PostgreSQL server: ``DATABASE_URL`` if set, else the local one on ``WEIR_PG_PORT`` (15432), as scripts/postgres.sh starts it."""
    return _env_str("DATABASE_URL", f"postgresql://weir@127.0.0.1:{_env_str('WEIR_PG_PORT', '15432')}/weir")


def load_named(setting: str, spec: str, what: str, accept: Callable[[Any], bool]) -> Any:
    """The object ``spec`` names (``module:NAME``) for setting ``setting``; ValueError naming the setting when the
    module cannot be imported or the name is not ``what`` (``accept`` says)."""
    module_name, _, name = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), name, None) if module_name and name else None
    except ImportError as error:
        raise SettingError(f"setting {setting}={spec!r}: cannot import {module_name!r} ({error})") from None
    if not accept(found):
        raise SettingError(f"setting {setting}={spec!r}: expected 'module:NAME' naming {what}, got {type(found).__name__}")
    return found


def load_declarations(setting: str, module_names: str, attribute: str, kind: type, agent_set: str) -> list[Any]:
    """The ``attribute`` lists (each a list of ``kind``) of the modules ``module_names`` names, together: the loader of
    ``WEIR_FLOWS`` (``FLOWS``) and ``WEIR_WINDOWS`` (``WINDOWS``). One module, or several comma separated."""
    names = [name.strip() for name in module_names.split(",") if name.strip()]
    if not names:
        example = f"'myapp.{agent_set}' defining {attribute}"
        raise SettingError(f"WEIR_AGENTS includes {agent_set!r} but {setting} names no module (expected e.g. {example})")
    found: list[Any] = []
    for module_name in names:
        try:
            declared = getattr(importlib.import_module(module_name), attribute, None)
        except ImportError as error:
            raise SettingError(f"setting {setting}={module_names!r}: cannot import {module_name!r} ({error})") from None
        if not isinstance(declared, list | tuple) or not all(isinstance(item, kind) for item in declared):
            message = (
                f"{setting}={module_names!r}: the module {module_name!r} must define {attribute}, a list of weir {kind.__name__} objects"
            )
            raise SettingError(message)
        found.extend(declared)
    return found


def _env_str(name: str, default: str) -> str:
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else raw


def _agents_from_env() -> tuple[str, ...]:
    raw = _env_str("WEIR_AGENTS", "all")
    if raw == "all":
        return AGENT_NAMES
    chosen = tuple(sorted({name.strip() for name in raw.split(",") if name.strip()}))
    malformed = [name for name in chosen if not re.fullmatch(r"[A-Za-z0-9_-]+", name)]
    if malformed or not chosen:
        message = (
            f"setting WEIR_AGENTS={raw!r}: expected 'all' or a comma list of agent set names (letters, digits, '_', '-'): "
            f"weir's {list(AGENT_NAMES + OPTIONAL_AGENT_NAMES)}, or an application's own (the worker refuses a name it does not serve)"
        )
        raise SettingError(message)
    return chosen


@dataclass(frozen=True)
class Settings:
    """weir's configuration. Each field names its environment variable and default."""

    #: KAFKA_BOOTSTRAP: host:port of the broker (default: the local broker of ``make broker``).
    bootstrap: str = "127.0.0.1:19092"
    #: WEIR_KAFKA_SECURITY_PROTOCOL: "PLAINTEXT" (default), "SASL_PLAINTEXT", "SASL_SSL" or "SSL".
    kafka_security_protocol: str = "PLAINTEXT"
    #: WEIR_KAFKA_SASL_MECHANISM: "PLAIN" (default), "SCRAM-SHA-256" or "SCRAM-SHA-512" (SASL_* protocols only).
    kafka_sasl_mechanism: str = "PLAIN"
    #: WEIR_KAFKA_SASL_USERNAME / WEIR_KAFKA_SASL_PASSWORD: the SASL user; the password is never shown (repr, logs).
    kafka_sasl_username: str = ""
    kafka_sasl_password: str = field(default="", repr=False)
    #: WEIR_KAFKA_SSL_CAFILE: PEM file of the CA that signed the broker's certificate (SSL, SASL_SSL);
    #: empty means the system's trusted CAs.
    kafka_ssl_cafile: str = ""
    #: WEIR_APP_ID: prefix of the consumer group / Faust app id; the stage set is appended.
    app_id: str = "weir"
    #: WEIR_TOPIC_PREFIX: prefix of every topic weir declares (tests use a unique one).
    topic_prefix: str = "weir."
    #: WEIR_AGENTS: which agents this process runs ("all" or e.g. "items" or "splitter,aggregator").
    agents: tuple[str, ...] = AGENT_NAMES
    #: WEIR_DATA_DIR: where RocksDB tables live.
    data_dir: Path = field(default_factory=lambda: _PROJECT_ROOT / ".weir" / "data")
    #: WEIR_WEB_HOST / WEIR_WEB_PORT: the worker's web server (read-only views), local by default.
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    #: WEIR_GUARANTEE: "exactly_once" (default) or "at_least_once".
    processing_guarantee: str = "exactly_once"
    #: WEIR_EVENT_LOOP: the event loop of a worker started from the command line (``Application.from_env``):
    #: "asyncio" (default) or "uvloop". Faust's own ``FAUST_LOOP`` (or ``faust -L``), when given, wins. Faust's banner
    #: shows "+uvloop" after the transport when the worker runs on it. Not the default: bench/changes.md.
    event_loop: str = "asyncio"
    #: WEIR_PARTITIONS: partitions of every topic weir declares (and so of every table).
    partitions: int = 4
    #: WEIR_REPLICATION_FACTOR: copies of every topic weir creates, the tables' changelogs included (1: one broker's
    #: loss loses them). A worker refuses to start, in one line, when the cluster has fewer brokers.
    replication_factor: int = 1
    #: WEIR_MIN_INSYNC_REPLICAS: ``min.insync.replicas`` of every topic weir creates: a write (acks=all, as every
    #: transactional one is) succeeds only while this many copies have it. At most the replication factor.
    min_insync_replicas: int = 1
    #: WEIR_STANDBY_REPLICAS: standby replicas of every table (Faust's ``table_standby_replicas``): that many other
    #: workers of the same agents each keep a copy of a table partition, read from its changelog as it is written,
    #: so that a takeover restores only what the standby had not read yet. 0: a takeover reads the whole changelog.
    standby_replicas: int = 0
    #: WEIR_COMMIT_INTERVAL: seconds between offset commits while busy (= longest transaction under exactly_once;
    #: 0.1 s is Kafka Streams' default under exactly-once).
    commit_interval: float = 0.1
    #: WEIR_COMMIT_IDLE_MS: commit as soon as no event has been processed for this long (0: only every
    #: commit_interval); once commits took a third of the last second, spaced by twice their average duration.
    #: Under load commits come every commit_interval.
    commit_idle_ms: int = 3
    #: WEIR_FETCH_MAX_WAIT_MS: how long the broker may hold a worker's fetch that finds nothing new (Faust sets 1.5 s).
    #: A worker has one fetch in flight per broker, and a partition whose fetched records it was still handling when
    #: that fetch went out is not in it: its next records wait for the fetch to come back. A three-stage pipeline's
    #: splitter+aggregator, its orders read, waited 1.2-1.3 s in every backlog run for outcomes already committed.
    fetch_max_wait_ms: int = 100
    #: WEIR_TRANSACTIONS (exactly_once): "per_worker" (Kafka's EOS v2, KIP-447: one transaction per worker,
    #: fenced by the consumer group's generation; see app/engine/kip447.py) or "per_partition" (EOS v1, Faust's layout:
    #: one transaction per source partition, fenced by its transactional id).
    transactions: str = "per_worker"
    #: WEIR_WORKER_ID (per_worker): this worker's transactional id suffix; unique among live workers and kept
    #: across its restarts, a restart then ends the transaction its killed predecessor left open at once.
    #: Empty: "<host name>-<web port>" (app.engine.worker_slot). A peer taking over from a worker that does not
    #: come back waits up to WEIR_TRANSACTION_TIMEOUT_MS for its open transaction.
    worker_id: str = ""
    #: WEIR_TRANSACTION_TIMEOUT_MS (per_worker): how long the broker keeps a dead worker's transaction open.
    transaction_timeout_ms: int = 10_000
    #: WEIR_STATIC_MEMBERSHIP: join the consumer groups as a static member (KIP-345), instance id WEIR_WORKER_ID
    #: or "<host name>-<web port>": a worker restarted in place within the session timeout gets its partitions
    #: back without a rebalance; a stopped worker does not leave its groups (its partitions wait for it, or
    #: for the session timeout). The default: with a SIGKILL of some stage every 5 s over 2,000 shop orders,
    #: static members served all of them in 224 s; dynamic members 315 in 900 s (the run was stopped).
    static_membership: bool = True
    #: WEIR_DIRECT_BATCHES: the consumer hands each agent's records to it in batches, past Faust's conductor,
    #: channel and Stream (``app.engine.inbox``); 0: Faust's stream, batched by weir's processor on it.
    direct_batches: bool = True
    #: WEIR_GC_TUNED: the worker's garbage collector walks less (``app.collector``: the started worker's objects
    #: frozen, a young collection every 20,000 allocations); 0: CPython's defaults.
    gc_tuned: bool = True
    #: WEIR_SESSION_TIMEOUT / WEIR_HEARTBEAT_INTERVAL / WEIR_REBALANCE_TIMEOUT (seconds): failure detection.
    session_timeout: float = 10.0
    heartbeat_interval: float = 1.0
    rebalance_timeout: float = 20.0
    #: WEIR_RETRY_ATTEMPTS / WEIR_RETRY_BACKOFF_MS / WEIR_RETRY_MAX_BACKOFF_MS: the default retry policy.
    retry_attempts: int = 3
    retry_backoff_ms: int = 100
    retry_max_backoff_ms: int = 2000
    #: WEIR_AGGREGATE_TIMEOUT_MS: how long a split group may stay open before it completes partial (0: no absolute deadline).
    aggregate_timeout_ms: int = 30_000
    #: WEIR_AGGREGATE_INACTIVITY_MS: a group that received nothing for this long completes partial (0: no inactivity timeout).
    aggregate_inactivity_ms: int = 0
    #: WEIR_AGGREGATE_REREQUEST_MS / WEIR_AGGREGATE_REREQUESTS: a split group still missing items this long after its
    #: split asks for them again (its open then carries the items' payloads), then again after as long, that many
    #: times at most, always before its deadline (0: never).
    aggregate_rerequest_ms: int = 0
    aggregate_rerequests: int = 2
    #: WEIR_TICK_INTERVAL_MS: how often each aggregator partition checks for expired deadlines.
    tick_interval_ms: int = 250
    #: WEIR_DONE_RETENTION_MS: how long a completed group is remembered to count late items.
    done_retention_ms: int = 600_000
    #: WEIR_ITEM_CONCURRENCY: items an async item step runs on at once, per items worker (a batch's items run together).
    item_concurrency: int = 100
    #: WEIR_ITEM_THREADS: the thread pool of a sync item step that blocks: there a message's items run at once, off the
    #: event loop (0: no pool, a sync step always runs in the event loop, one item after the other).
    item_threads: int = 16
    #: WEIR_ITEM_BLOCKING_MS: a sync item step runs in the event loop (the cheapest for a short step) until two calls in a
    #: row take longer than this; from then on it runs in the pool of WEIR_ITEM_THREADS (0: always in the pool).
    item_blocking_ms: int = 20
    #: WEIR_SPLIT_CHUNK: items of one order the splitter puts in one item message (1: one message per item).
    split_chunk: int = 10
    #: WEIR_BUNDLE: messages of one batch put in one record per destination partition (a ``bundle``): the
    #: splitter's item messages, an items worker's outcome messages (1: one record per message).
    bundle: int = 50
    #: WEIR_ITEMS_INLINE: the splitter runs the item step on an order's items itself and sends the order's
    #: result, in the transaction of the order's offset: one hop instead of three, for a cheap step
    #: (no items or aggregator stage at work). Needs exactly_once.
    items_inline: bool = False
    #: WEIR_BATCH_SIZE / WEIR_BATCH_WAIT_MS: events the split/aggregate agents take per batch, and the longest
    #: wait for a batch to fill. One batch's part of a partition is one unit: each table key is written once,
    #: every send and changelog write is awaited once, all its offsets are acked together.
    batch_size: int = 500
    batch_wait_ms: int = 5
    #: WEIR_PRODUCER_LINGER_MS: how long a send waits for more sends to share its produce request.
    producer_linger_ms: int = 0
    #: WEIR_MAX_MESSAGE_BYTES: larger input messages are dead-lettered, not parsed.
    max_message_bytes: int = 1_000_000
    #: WEIR_TRACE_FILE: diagnostic: every worker appends each handled event and committed offset there (empty: none).
    trace_file: str = ""
    #: WEIR_ITEM_PROCESSOR: "module:function" run for each item (default: the item's payload is its result).
    item_processor: str = "weir.app.pipeline:as_is"
    #: WEIR_FLOWS: the module whose FLOWS list the 'flows' agent set runs (see app/flows.py).
    flows_module: str = ""
    #: WEIR_WINDOWS: the modules (comma separated) whose WINDOWS lists the 'windows' agent set runs (see app/windows.py).
    windows_module: str = ""
    #: WEIR_FLOWS_RUN: which of those flows this process runs, by name ("a,b"; default: all of them). A
    #: flow runs with its barriers and its split/aggregate stages; each selection is its own consumer group.
    flows_run: tuple[str, ...] = ()
    #: WEIR_EOF_JOB: "module:NAME" of the end-of-stream job (a tables.eof.EofJob: select, zero/merge, join) the
    #: eof_* agents run; no default: a worker running them refuses to start without it.
    eof_job: str = ""
    #: WEIR_EOF_MAX_BATCH_ORDERS: the EOF filter splits a batch with more records kept than this.
    eof_max_batch_orders: int = 50
    #: WEIR_EOF_IDLE_TIMEOUT_MS: a client with no activity for this long is reported abandoned and cleaned up.
    eof_idle_timeout_ms: int = 300_000
    #: WEIR_EOF_CLOSED_RETENTION_MS: how long a finished client's tombstone absorbs late duplicates.
    eof_closed_retention_ms: int = 60_000
    #: WEIR_TRIGGER_BATCH_SIZE / WEIR_TRIGGER_BATCH_WAIT_MS: completion events read per batch, and the
    #: longest wait for a batch to fill (a light load never waits longer).
    trigger_batch_size: int = 500
    trigger_batch_wait_ms: int = 50
    #: WEIR_SWEEP_INTERVAL_MS / WEIR_SWEEP_GRACE_MS / WEIR_SWEEP_PAGE_SIZE: the safety sweep's period, how
    #: long a trigger waits before the sweep looks at it, and how many triggers one sweep step reads.
    sweep_interval_ms: int = 5_000
    sweep_grace_ms: int = 10_000
    sweep_page_size: int = 200
    #: WEIR_TRIGGER_ORPHAN_RETENTION_MS: how long a counter trigger's state that has not fired is kept after the last
    #: event that changed it (completions of a parent that never registered, a registration whose
    #: children never all end); then it goes to the dead letters (``orphan-completions``, ``never-fired``).
    trigger_orphan_retention_ms: int = 3_600_000
    #: WEIR_TRIGGER_STATUS_DB: the database whose table ``weir_trigger_status`` holds the children's final statuses,
    #: committed with their work (app/trigger_status.py): a SQLite path or a postgresql:// URL. The safety sweep's
    #: source of truth; empty: the outbox's database (WEIR_OUTBOX_DB, where ``child_done`` writes them), so the sweep
    #: is on by default; ``none``: no source, the sweep fires nothing.
    trigger_status_db: str = ""
    #: WEIR_TRIGGER_STATUS_QUERY: the sweep's check as a query over the user's own tables in that database instead of
    #: ``weir_trigger_status``: selects (parent id, child id, outcome) of the children that ended, of the parents
    #: listed where it says ``{parents}``. Empty: weir's table.
    trigger_status_query: str = ""
    #: WEIR_SWEEP_QUERY_TIMEOUT_MS: how long one sweep step waits for the status source's answer; a step without it
    #: fires nothing and looks at its triggers again later.
    sweep_query_timeout_ms: int = 5_000
    #: WEIR_TRIGGER_STATUS_RETENTION_MS: how long a child's status row stays in ``weir_trigger_status``; a triggers
    #: worker deletes older rows every tenth of it (at most every 10 minutes). Default twice
    #: WEIR_TRIGGER_ORPHAN_RETENTION_MS: a row is read only for a trigger still waiting, and a trigger waits no longer.
    trigger_status_retention_ms: int = 7_200_000
    #: WEIR_OUTBOX_DB: the outbox database (SQLite file path, or a postgresql:// URL).
    outbox_db: str = field(default_factory=lambda: str(_PROJECT_ROOT / ".weir" / "outbox.sqlite"))
    #: WEIR_OUTBOX_BATCH: outbox rows the relay publishes per round.
    outbox_batch: int = 500
    #: WEIR_OUTBOX_METRICS_PORT: the port of the relay process's /metrics (on WEIR_WEB_HOST); 0: none.
    outbox_metrics_port: int = 0

    def kafka_ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of every Kafka connection, or None when the protocol has no TLS."""
        if self.kafka_security_protocol not in ("SSL", "SASL_SSL"):
            return None
        return ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=self.kafka_ssl_cafile or None)

    def kafka_client_options(self) -> dict[str, Any]:
        """The security keyword arguments of every aiokafka client (producer, consumer, admin) weir makes."""
        options: dict[str, Any] = {"security_protocol": self.kafka_security_protocol}
        if self.kafka_security_protocol.startswith("SASL_"):
            options.update(
                sasl_mechanism=self.kafka_sasl_mechanism,
                sasl_plain_username=self.kafka_sasl_username,
                sasl_plain_password=self.kafka_sasl_password,
            )
        context = self.kafka_ssl_context()
        if context is not None:
            options["ssl_context"] = context
        return options

    @property
    def stage(self) -> str:
        """The name of the stage set this process runs: "all" or the agents joined by "_"."""
        if self.agents == AGENT_NAMES:
            return "all"
        # flows with a selection: "flows.<name>.<name>" (the group id names topics: letters, digits, ".", "_", "-")
        selected = "flows." + ".".join(re.sub(r"[^A-Za-z0-9_-]", "_", name) for name in self.flows_run)
        return "_".join(selected if agent == "flows" and self.flows_run else agent for agent in self.agents)

    @property
    def group_id(self) -> str:
        # One consumer group per stage set: Faust's assignor hands every topic of a group to every
        # member, so processes running different agents must not share a group.
        return f"{self.app_id}-{self.stage}"

    def __post_init__(self) -> None:
        if self.trigger_status_query and self.trigger_status_query.count("{parents}") != 1:
            message = (
                f"setting WEIR_TRIGGER_STATUS_QUERY={self.trigger_status_query!r:.200}: the query takes the waiting parents' ids "
                "where it says {parents}, once"
            )
            raise SettingError(message)
        if self.min_insync_replicas > self.replication_factor:
            message = (
                f"setting WEIR_MIN_INSYNC_REPLICAS={self.min_insync_replicas}: must be at most WEIR_REPLICATION_FACTOR "
                f"({self.replication_factor}), or no write would ever succeed"
            )
            raise SettingError(message)

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"

    @property
    def trigger_status_location(self) -> str | None:
        """Where the safety sweep reads the children's statuses: WEIR_TRIGGER_STATUS_DB, by default the outbox's
        database; None when it is ``none`` (the sweep fires nothing)."""
        location = self.trigger_status_db or self.outbox_db
        return None if location.strip().lower() == "none" else location

    def topic_config(self) -> dict[str, str]:
        """The configuration of every topic weir creates (Kafka's topic-level names)."""
        return {"min.insync.replicas": str(self.min_insync_replicas)}

    def retry_policy(self) -> RetryPolicy:
        """The retry policy of the steps (``WEIR_RETRY_ATTEMPTS``, ``WEIR_RETRY_BACKOFF_MS``, ``WEIR_RETRY_MAX_BACKOFF_MS``)."""
        return RetryPolicy(attempts=self.retry_attempts, backoff_ms=self.retry_backoff_ms, max_backoff_ms=self.retry_max_backoff_ms)

    @classmethod
    def from_env(cls) -> Settings:
        """The settings the environment variables give (each field names its variable); parsed at a command's edge
        only (a worker's ``app.core``, a demo's ``main``): a library user passes a value (``Settings(partitions=2)``)."""
        return load_settings()


class _Security(TypedDict):
    kafka_security_protocol: str
    kafka_sasl_mechanism: str
    kafka_sasl_username: str
    kafka_sasl_password: str
    kafka_ssl_cafile: str


def _security_from_env() -> _Security:
    """The Kafka connection's security settings, checked (messages never include the password)."""
    defaults = Settings()
    protocol = _env_str("WEIR_KAFKA_SECURITY_PROTOCOL", defaults.kafka_security_protocol).upper()
    if protocol not in SECURITY_PROTOCOLS:
        message = f"setting WEIR_KAFKA_SECURITY_PROTOCOL={protocol!r}: expected one of {list(SECURITY_PROTOCOLS)}"
        raise SettingError(message)
    mechanism = _env_str("WEIR_KAFKA_SASL_MECHANISM", defaults.kafka_sasl_mechanism).upper()
    if mechanism not in SASL_MECHANISMS:
        message = f"setting WEIR_KAFKA_SASL_MECHANISM={mechanism!r}: expected one of {list(SASL_MECHANISMS)}"
        raise SettingError(message)
    username = _env_str("WEIR_KAFKA_SASL_USERNAME", "")
    password = _env_str("WEIR_KAFKA_SASL_PASSWORD", "")
    if protocol.startswith("SASL_") and not (username and password):
        missing = [name for name, value in (("WEIR_KAFKA_SASL_USERNAME", username), ("WEIR_KAFKA_SASL_PASSWORD", password)) if not value]
        message = f"setting WEIR_KAFKA_SECURITY_PROTOCOL={protocol!r} needs a SASL user: {missing} not set"
        raise SettingError(message)
    cafile = _env_str("WEIR_KAFKA_SSL_CAFILE", "")
    if cafile and not Path(cafile).is_file():
        message = f"setting WEIR_KAFKA_SSL_CAFILE={cafile!r}: no such file (expected the PEM file of the broker's CA)"
        raise SettingError(message)
    return {
        "kafka_security_protocol": protocol,
        "kafka_sasl_mechanism": mechanism,
        "kafka_sasl_username": username,
        "kafka_sasl_password": password,
        "kafka_ssl_cafile": cafile,
    }


def kafka_client_options() -> dict[str, Any]:
    """The aiokafka security options the environment asks for (see :meth:`Settings.kafka_client_options`)."""
    return Settings(**_security_from_env()).kafka_client_options()


def load_settings() -> Settings:
    """Read the settings from the environment (see each field of :class:`Settings`)."""
    defaults = Settings()
    guarantee = _env_str("WEIR_GUARANTEE", defaults.processing_guarantee)
    if guarantee not in ("exactly_once", "at_least_once"):
        message = f"setting WEIR_GUARANTEE={guarantee!r}: expected 'exactly_once' or 'at_least_once'"
        raise SettingError(message)
    transactions = _env_str("WEIR_TRANSACTIONS", defaults.transactions)
    if transactions not in ("per_partition", "per_worker"):
        message = f"setting WEIR_TRANSACTIONS={transactions!r}: expected 'per_partition' or 'per_worker'"
        raise SettingError(message)
    event_loop = _env_str("WEIR_EVENT_LOOP", defaults.event_loop)
    if event_loop not in ("uvloop", "asyncio"):
        message = f"setting WEIR_EVENT_LOOP={event_loop!r}: expected 'uvloop' or 'asyncio'"
        raise SettingError(message)
    agents = _agents_from_env()
    orphan_retention_ms = _env_int("WEIR_TRIGGER_ORPHAN_RETENTION_MS", defaults.trigger_orphan_retention_ms, 0)
    return Settings(
        bootstrap=default_bootstrap(),
        **_security_from_env(),
        app_id=_env_str("WEIR_APP_ID", defaults.app_id),
        topic_prefix=_env_str("WEIR_TOPIC_PREFIX", defaults.topic_prefix),
        agents=agents,
        data_dir=Path(_env_str("WEIR_DATA_DIR", str(defaults.data_dir))),
        web_host=_env_str("WEIR_WEB_HOST", defaults.web_host),
        web_port=_env_int("WEIR_WEB_PORT", defaults.web_port, 0, 65535),
        processing_guarantee=guarantee,
        event_loop=event_loop,
        partitions=_env_int("WEIR_PARTITIONS", defaults.partitions, 1),
        replication_factor=_env_int("WEIR_REPLICATION_FACTOR", defaults.replication_factor, 1, 32767),
        min_insync_replicas=_env_int("WEIR_MIN_INSYNC_REPLICAS", defaults.min_insync_replicas, 1, 32767),
        standby_replicas=_env_int("WEIR_STANDBY_REPLICAS", defaults.standby_replicas, 0, 16),
        commit_interval=_env_float("WEIR_COMMIT_INTERVAL", defaults.commit_interval, 0.001),
        commit_idle_ms=_env_int("WEIR_COMMIT_IDLE_MS", defaults.commit_idle_ms, 0),
        fetch_max_wait_ms=_env_int("WEIR_FETCH_MAX_WAIT_MS", defaults.fetch_max_wait_ms, 0),
        transactions=transactions,
        worker_id=_env_str("WEIR_WORKER_ID", defaults.worker_id),
        transaction_timeout_ms=_env_int("WEIR_TRANSACTION_TIMEOUT_MS", defaults.transaction_timeout_ms, 1000),
        static_membership=_env_bool("WEIR_STATIC_MEMBERSHIP", defaults.static_membership),
        direct_batches=_env_bool("WEIR_DIRECT_BATCHES", defaults.direct_batches),
        gc_tuned=_env_bool("WEIR_GC_TUNED", defaults.gc_tuned),
        session_timeout=_env_float("WEIR_SESSION_TIMEOUT", defaults.session_timeout, 1),
        heartbeat_interval=_env_float("WEIR_HEARTBEAT_INTERVAL", defaults.heartbeat_interval, 0.1),
        rebalance_timeout=_env_float("WEIR_REBALANCE_TIMEOUT", defaults.rebalance_timeout, 1),
        retry_attempts=_env_int("WEIR_RETRY_ATTEMPTS", defaults.retry_attempts, 1),
        retry_backoff_ms=_env_int("WEIR_RETRY_BACKOFF_MS", defaults.retry_backoff_ms, 0),
        retry_max_backoff_ms=_env_int("WEIR_RETRY_MAX_BACKOFF_MS", defaults.retry_max_backoff_ms, 0),
        aggregate_timeout_ms=_env_int("WEIR_AGGREGATE_TIMEOUT_MS", defaults.aggregate_timeout_ms, 0),
        aggregate_inactivity_ms=_env_int("WEIR_AGGREGATE_INACTIVITY_MS", defaults.aggregate_inactivity_ms, 0),
        aggregate_rerequest_ms=_env_int("WEIR_AGGREGATE_REREQUEST_MS", defaults.aggregate_rerequest_ms, 0),
        aggregate_rerequests=_env_int("WEIR_AGGREGATE_REREQUESTS", defaults.aggregate_rerequests, 0),
        tick_interval_ms=_env_int("WEIR_TICK_INTERVAL_MS", defaults.tick_interval_ms, 1),
        done_retention_ms=_env_int("WEIR_DONE_RETENTION_MS", defaults.done_retention_ms, 0),
        item_concurrency=_env_int("WEIR_ITEM_CONCURRENCY", defaults.item_concurrency, 1),
        item_threads=_env_int("WEIR_ITEM_THREADS", defaults.item_threads, 0),
        item_blocking_ms=_env_int("WEIR_ITEM_BLOCKING_MS", defaults.item_blocking_ms, 0),
        split_chunk=_env_int("WEIR_SPLIT_CHUNK", defaults.split_chunk, 1),
        bundle=_env_int("WEIR_BUNDLE", defaults.bundle, 1),
        items_inline=_env_bool("WEIR_ITEMS_INLINE", defaults.items_inline),
        batch_size=_env_int("WEIR_BATCH_SIZE", defaults.batch_size, 1),
        batch_wait_ms=_env_int("WEIR_BATCH_WAIT_MS", defaults.batch_wait_ms, 0),
        producer_linger_ms=_env_int("WEIR_PRODUCER_LINGER_MS", defaults.producer_linger_ms, 0),
        max_message_bytes=_env_int("WEIR_MAX_MESSAGE_BYTES", defaults.max_message_bytes, 16_384),
        trace_file=_env_str("WEIR_TRACE_FILE", defaults.trace_file),
        item_processor=_env_str("WEIR_ITEM_PROCESSOR", defaults.item_processor),
        flows_module=_env_str("WEIR_FLOWS", defaults.flows_module),
        windows_module=_env_str("WEIR_WINDOWS", defaults.windows_module),
        flows_run=tuple(sorted({name.strip() for name in _env_str("WEIR_FLOWS_RUN", "").split(",") if name.strip()})),
        eof_job=_env_str("WEIR_EOF_JOB", defaults.eof_job),
        eof_max_batch_orders=_env_int("WEIR_EOF_MAX_BATCH_ORDERS", defaults.eof_max_batch_orders, 1),
        eof_idle_timeout_ms=_env_int("WEIR_EOF_IDLE_TIMEOUT_MS", defaults.eof_idle_timeout_ms, 1),
        eof_closed_retention_ms=_env_int("WEIR_EOF_CLOSED_RETENTION_MS", defaults.eof_closed_retention_ms, 0),
        trigger_batch_size=_env_int("WEIR_TRIGGER_BATCH_SIZE", defaults.trigger_batch_size, 1),
        trigger_batch_wait_ms=_env_int("WEIR_TRIGGER_BATCH_WAIT_MS", defaults.trigger_batch_wait_ms, 0),
        sweep_interval_ms=_env_int("WEIR_SWEEP_INTERVAL_MS", defaults.sweep_interval_ms, 1),
        sweep_grace_ms=_env_int("WEIR_SWEEP_GRACE_MS", defaults.sweep_grace_ms, 0),
        sweep_page_size=_env_int("WEIR_SWEEP_PAGE_SIZE", defaults.sweep_page_size, 1),
        trigger_orphan_retention_ms=orphan_retention_ms,
        trigger_status_db=_env_str("WEIR_TRIGGER_STATUS_DB", defaults.trigger_status_db),
        trigger_status_query=_env_str("WEIR_TRIGGER_STATUS_QUERY", defaults.trigger_status_query),
        sweep_query_timeout_ms=_env_int("WEIR_SWEEP_QUERY_TIMEOUT_MS", defaults.sweep_query_timeout_ms, 1),
        trigger_status_retention_ms=_env_int("WEIR_TRIGGER_STATUS_RETENTION_MS", 2 * orphan_retention_ms, 0),
        outbox_db=_env_str("WEIR_OUTBOX_DB", defaults.outbox_db),
        outbox_batch=_env_int("WEIR_OUTBOX_BATCH", defaults.outbox_batch, 1),
        outbox_metrics_port=_env_int("WEIR_OUTBOX_METRICS_PORT", defaults.outbox_metrics_port, 0, 65535),
    )
