"""The engine's configuration, given once to :func:`app.engine.install` (no module global is set from outside)."""

from __future__ import annotations

import socket
from dataclasses import dataclass

__all__ = ["EngineConfig", "installed", "worker_slot"]


@dataclass(frozen=True)
class EngineConfig:
    """How the exactly-once machinery runs in this process; ``app.core`` builds it from :mod:`app.settings`.

    The defaults are Faust's behaviour where weir has a choice: one transaction per source partition, a
    dynamic group member, a commit on Faust's fixed timer, deliveries awaited by each batch.
    """

    #: WEIR_TRANSACTIONS=per_worker: the suffix of this worker's one transactional id, ``<app id>-worker-<suffix>``
    #: ("": :func:`worker_slot`; KIP-447, :mod:`app.engine.kip447`). None: one transaction per source partition.
    worker_transaction: str | None = None
    #: WEIR_TRANSACTION_TIMEOUT_MS: the transaction timeout of a per-worker transaction.
    transaction_timeout_ms: int = 10_000
    #: WEIR_STATIC_MEMBERSHIP: this worker's group instance id ("": :func:`worker_slot`; None: a dynamic member).
    static_member: str | None = None
    #: WEIR_FETCH_MAX_WAIT_MS: the worker consumer's ``fetch_max_wait_ms`` (None: Faust's 1,500).
    fetch_max_wait_ms: int | None = None
    #: WEIR_COMMIT_IDLE_MS: commit once no event has been processed for this long (0: Faust's fixed interval).
    commit_idle_s: float = 0.0
    #: A commit started by a pause comes at least this many times the recent commits' average duration after
    #: the last one (:class:`app.engine.commit.CommitBudget`).
    commit_spacing: float = 2.0
    #: Under exactly_once: a batch's deliveries are awaited by the commit, not by the batch (:func:`app.engine.scopes.batch_scope`).
    defer_deliveries: bool = False
    #: WEIR_DIRECT_BATCHES: the delivery loop hands an agent's records to its inbox in batches, past Faust's
    #: conductor, channel and Stream (:mod:`app.engine.inbox`). False: Faust's way (:func:`app.engine.streams.take_ready`).
    direct_batches: bool = False
    #: The size limit of the record batches a batch's sends go out in (:mod:`app.engine.produce`), in bytes before
    #: compression: at most the broker's message.max.bytes (WEIR_MAX_MESSAGE_BYTES) less 1 KiB, at most 512 KiB.
    record_batch_bytes: int = 512 * 1024
    #: How long a scope waits for its table changelog writes and sends to be delivered before the worker gives up.
    delivery_timeout_s: float = 30.0
    #: WEIR_TRACE_FILE: every event handled and every offset committed is appended there, one line each (a
    #: diagnostic for the open takeover defect: which offsets were committed without being handled). None: off.
    trace_file: str | None = None


_installed = EngineConfig()


def installed() -> EngineConfig:
    """The configuration :func:`app.engine.install` was given (the defaults before it ran)."""
    return _installed


def _install(config: EngineConfig) -> None:
    global _installed
    _installed = config


def worker_slot(web_port: int) -> str:
    """The default per-worker transaction id suffix: ``<host name>-<web port>``.

    Unique among live workers: two workers of one host cannot both listen on one port, and a worker's web
    server is up before its consumer joins the group, i.e. before its first transaction (a second worker
    started on a taken port stops before it could fence the first one). Kept across restarts: a worker
    restarted on its host and port (a service manager's restart, a container's) ends the transaction its
    killed predecessor left open when it starts, instead of its partitions waiting for the transaction
    timeout. The port is read when the first transaction starts, after ``faust worker --web-port``.
    """
    return f"{socket.gethostname()}-{web_port}"
