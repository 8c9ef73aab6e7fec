"""Declarative flows: a name, a source topic, steps in order (process, filter, split/aggregate, barrier, to).

    kitchen = Flow("kitchen", source="kitchen").process("cook", cook)
    payment = Flow("payment", source="payment").process("authorize", authorize)
    dispatch = (
        Flow("dispatch", source="dispatch-in")
        .process("validate", validate)
        .barrier("await-kitchen-and-payment", correlate_by=header("order-id"),
                 awaits=["kitchen", Await("payment", key=payload("order.id"))], timeout_ms=30 * 60_000,
                 on_duplicate="reject")     # a second exchange for the order while one waits: dead-lettered
        .process("dispatch-order", dispatch_order)
        .to("dispatched")
    )
    orders = (
        Flow("orders", source="orders")
        .split("items", payload("items"), correlate_by=payload("order_id"))
        .process("price", price_item)              # per item, on any worker of the flow
        .aggregate("order-total", timeout_ms=30_000)  # the merged outcomes become the payload
        .to("priced-orders")
    )

A flow compiles into Faust agents (``agents/flows.py``). Every execution (an exchange from entering its
flow until it leaves the last step, is dropped by a filter, or fails for good) publishes its outcome;
barriers of other flows await those outcomes by key. Declaration errors are raised by the builder
methods; errors of the whole graph (an await of a topic no flow reads, a flow awaiting itself, a cycle
of waits) by :func:`validate_flows`, at worker start.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from weir.app.errors import attempt
from weir.tables.aggregates import CONTINUE_ON_FAILURE, ONE_SHOT, STOP_ON_FAILURE, AggregatorConfig
from weir.tables.barrier import DUPLICATE_RULES, FAIL, GIVE_UP_RULES, MEMORY_RULES, REJECT, REMEMBER, GiveUp, Memory, OnDuplicate
from weir.tables.windows import SessionSpec, WindowSpec

__all__ = [
    "WindowStep",
    "Exchange",
    "Flow",
    "Await",
    "Barrier",
    "Step",
    "Split",
    "Aggregate",
    "Segment",
    "KeyExpr",
    "header",
    "payload",
    "FlowDeclarationError",
    "FlowGraphError",
    "validate_flows",
]


class FlowDeclarationError(ValueError):
    """A flow or barrier is declared wrongly; raised where it is declared."""


class FlowGraphError(ValueError):
    """The flows together cannot run (a missing awaited flow, a self-wait, a cycle); raised at startup."""


@dataclass
class Exchange:
    """What travels through a flow: the payload, headers (strings) and properties (anything JSON)."""

    payload: Any
    headers: dict[str, str] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    key: str | None = None

    @property
    def attempt(self) -> int:
        """Which attempt of the running step this is: 1, then 2, 3... when the retry policy runs it again."""
        return attempt()

    @property
    def redelivered(self) -> bool:
        """Whether the running step ran before on this exchange and failed (Camel's ``CamelRedelivered``)."""
        return attempt() > 1

    def to_dict(self) -> dict[str, Any]:
        return {"payload": self.payload, "headers": dict(self.headers), "properties": dict(self.properties), "key": self.key}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Exchange:
        return cls(
            payload=raw.get("payload"),
            headers=dict(raw.get("headers") or {}),
            properties=dict(raw.get("properties") or {}),
            key=raw.get("key"),
        )


@dataclass(frozen=True)
class KeyExpr:
    """Reads a correlation key from an exchange: a header, or a dotted path into the payload."""

    description: str
    read: Callable[[Exchange], Any]

    def __call__(self, exchange: Exchange) -> str | None:
        try:
            value = self.read(exchange)
        except (KeyError, IndexError, TypeError, AttributeError):
            return None
        if value is None or isinstance(value, dict | list):
            return None
        return str(value)


def _flag_of(expr: KeyExpr) -> Callable[[Exchange], Any]:
    """A flag read by a key expression: its value, or None where the exchange does not have it (a header or field absent)."""

    def flag(exchange: Exchange) -> Any:
        try:
            return expr.read(exchange)
        except (KeyError, IndexError, TypeError, AttributeError):
            return None

    return flag


def header(name: str) -> KeyExpr:
    """The key is the value of header ``name``."""
    return KeyExpr(f"header {name!r}", lambda exchange: exchange.headers[name])


def payload(path: str) -> KeyExpr:
    """The key is the payload value at dotted ``path`` (e.g. ``"order.id"``)."""

    def read(exchange: Exchange) -> Any:
        value = exchange.payload
        for part in path.split("."):
            if isinstance(value, list):
                if not part.isdigit():
                    raise KeyError(part)  # a name is no index into a list: the key is absent, as in an object without it
                value = value[int(part)]
            else:
                value = value[part]
        return value

    return KeyExpr(f"payload {path!r}", read)


@dataclass(frozen=True)
class Await:
    """One awaited flow, named by the topic it reads, optionally with a key of its own.

    ``count``: the waiting exchange awaits that many executions of the flow for its key (an int, or read from the
    waiting exchange: a function or key expression; zero is satisfied at once), each counted once by
    ``distinct_by`` read from the awaited flow's exchange on entry (default: the execution's id). ``results``: the
    executions' payloads, as they ended, are handed to the released exchange (``properties["barriers"]``).
    """

    source: str
    key: KeyExpr | None = None
    count: int | Callable[[Exchange], Any] | None = None
    distinct_by: KeyExpr | None = None
    results: bool = False


@dataclass(frozen=True)
class Barrier:
    """A barrier step: the exchange waits until every awaited flow completed for its key."""

    name: str
    awaits: tuple[Await, ...]
    timeout_ms: int
    correlate_by: KeyExpr | None
    #: what an exchange arriving on a key where another one waits does (see :meth:`Flow.barrier`)
    on_duplicate: OnDuplicate = REJECT
    #: at the timeout: fail the exchange ("fail") or let it go on, marked "timeout" ("continue")
    on_timeout: GiveUp = FAIL
    #: when an awaited execution failed: fail the exchange ("fail") or let it go on at once, marked "failed"
    on_failure: GiveUp = FAIL
    #: a completion that let a waiter go on: kept for the timeout ("remember") or gone with that release ("consume")
    memory: Memory = REMEMBER

    def key_for(self, awaited: Await) -> KeyExpr:
        key = awaited.key or self.correlate_by
        assert key is not None  # checked at declaration
        return key

    @property
    def reports(self) -> bool:
        """Whether the released exchange is told how its wait ended (``properties["barriers"][name]``): when it may
        go on without every completion, or when an await counts executions or asks for their results."""
        knobs = self.on_timeout != FAIL or self.on_failure != FAIL
        return knobs or any(awaited.count is not None or awaited.results for awaited in self.awaits)


@dataclass(frozen=True)
class Split:
    """A split step: the exchange's items go out one by one (in chunks) to the steps up to the matching aggregate."""

    name: str
    items: Callable[[Exchange], Any]
    correlate_by: KeyExpr | None
    chunk: int | None
    #: what a failed item does (Camel puts stopOnException and shareUnitOfWork on the split): the matching aggregate's
    #: rule when it names none (:meth:`Flow.aggregate`); None: the aggregate's, by default "continue"
    on_item_failure: str | None = None


#: What an aggregate after a split does with a failed item (:meth:`Flow.aggregate`).
FAIL_PARENT = "fail-parent"
ITEM_FAILURE_RULES = (CONTINUE_ON_FAILURE, STOP_ON_FAILURE, FAIL_PARENT)


@dataclass(frozen=True)
class Aggregate:
    """An aggregate step: the items' outcomes merged by correlation id, complete by count, last-flag, a timeout or force."""

    name: str
    timeout_ms: int | None
    complete_by: tuple[str, ...]
    inactivity_ms: int | None = None
    #: a correlation aggregate (no split before it): the key its exchanges are grouped by
    correlate_by: KeyExpr | None = None
    groups: str = ONE_SHOT
    complete_size: int | None = None
    complete_when: Callable[[list[Any]], bool] | None = None
    #: a correlation aggregate: an exchange for which this is true completes its group now, with it
    complete_on: Callable[[Exchange], Any] | None = None
    #: after a split: an item that failed is merged ("continue"), ends the group failed ("stop"), or fails the
    #: parent exchange as one ("fail-parent")
    on_item_failure: str = "continue"
    #: every open group completes at each multiple of this period (Camel's completionInterval)
    complete_interval_ms: int | None = None
    #: a correlation aggregate: the absolute timeout (ms) of a group, read from the exchange that opens it
    timeout_from: Callable[[Exchange], Any] | None = None
    #: a correlation aggregate: an exchange that opens a group completes the group open in its partition
    complete_on_new_group: bool = False
    #: a correlation aggregate: every group a batch brought exchanges to completes at the batch's end
    complete_at_batch_end: bool = False

    @property
    def correlates(self) -> bool:
        """A correlation aggregate: groups exchanges by ``correlate_by`` (not a split's items by index)."""
        return self.correlate_by is not None

    def config(self, *, done_retention_ms: int) -> AggregatorConfig:
        """The aggregate's :class:`~tables.aggregates.AggregatorConfig` (it checks the knobs)."""
        return AggregatorConfig(
            name=self.name,
            timeout_ms=self.timeout_ms,
            inactivity_ms=self.inactivity_ms,
            complete_by=frozenset(self.complete_by),
            done_retention_ms=done_retention_ms,
            groups=self.groups,
            complete_size=self.complete_size,
            complete_when=self.complete_when,
            on_item_failure=CONTINUE_ON_FAILURE if self.on_item_failure == CONTINUE_ON_FAILURE else STOP_ON_FAILURE,
            complete_interval_ms=self.complete_interval_ms,
            complete_on_new_group=self.complete_on_new_group,
            complete_at_batch_end=self.complete_at_batch_end,
        )


@dataclass(frozen=True)
class WindowStep:
    """A window step (:meth:`Flow.window`): the exchanges' payloads folded per key into windows of event time."""

    name: str
    spec: WindowSpec | SessionSpec
    #: the key of the exchange's windows (None: the exchange's key)
    key: Callable[[Exchange], Any] | None
    initial: Any
    fold: Callable[[Any, Any], Any]
    #: the exchange's event time in ms (None: the timestamp of the record that started its execution)
    timestamp: Callable[[Exchange], Any] | None
    emit: str
    merge: Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Step:
    kind: str  # "process", "filter", "barrier", "to", "split", "aggregate", "window"
    name: str
    function: Callable[[Exchange], Any] | None = None
    barrier: Barrier | None = None
    topic: str | None = None
    split: Split | None = None
    aggregate: Aggregate | None = None
    #: a "to" step: the record key, read from each record's payload (default: the exchange's key)
    key: KeyExpr | None = None
    #: a "to" step: the payloads to send, one record each (default: the exchange's payload, one record)
    each: Callable[[Exchange], Any] | None = None
    window: WindowStep | None = None


@dataclass(frozen=True)
class Segment:
    """The steps a split hands its items to: ``steps[first:last]`` run per item, ``steps[last]`` is the aggregate."""

    split_index: int
    aggregate_index: int

    @property
    def item_steps(self) -> range:
        return range(self.split_index + 1, self.aggregate_index)


class Flow:
    """A flow: reads one topic, runs its steps in order."""

    def __init__(self, name: str, *, source: str, id_by: KeyExpr | None = None) -> None:
        """``id_by``: the execution's identity, read from the exchange on entry (default: the source record's
        position). Records with the same identity are one execution at the flow's barriers: a message sent twice
        (a producer that replayed) waits once and goes on once, as Camel's idempotent consumer."""
        if not name or not source:
            message = f"flow {name!r}: a flow needs a name and a source topic, got source {source!r}"
            raise FlowDeclarationError(message)
        self.name = name
        self.source = source
        self.id_by = id_by
        self.steps: list[Step] = []

    def __repr__(self) -> str:
        return f"<Flow {self.name!r} from {self.source!r}: {[step.name for step in self.steps]}>"

    def _add(self, step: Step) -> Flow:
        if any(existing.name == step.name for existing in self.steps):
            message = f"flow {self.name!r}: two steps are named {step.name!r}"
            raise FlowDeclarationError(message)
        split = self._open_split()
        if split is not None and step.kind not in ("process", "aggregate"):
            message = (
                f"flow {self.name!r}, step {step.name!r}: between split {split.name!r} and its aggregate only process steps "
                f"run (per item), got a {step.kind} step"
            )
            raise FlowDeclarationError(message)
        self.steps.append(step)
        return self

    def _open_split(self) -> Step | None:
        """The split step not yet closed by an aggregate, if any."""
        open_split = None
        for step in self.steps:
            if step.kind == "split":
                open_split = step
            elif step.kind == "aggregate":
                open_split = None
        return open_split

    def segments(self) -> list[Segment]:
        """Each split with its aggregate (a flow whose split has no aggregate is refused by :func:`validate_flows`)."""
        found: list[Segment] = []
        start: int | None = None
        for index, step in enumerate(self.steps):
            if step.kind == "split":
                start = index
            elif step.kind == "aggregate" and start is not None:
                found.append(Segment(start, index))
                start = None
        return found

    def correlation_aggregates(self) -> list[int]:
        """The indexes of the aggregate steps that group exchanges by key (no split before them)."""
        return [index for index, step in enumerate(self.steps) if step.aggregate is not None and step.aggregate.correlates]

    def split(
        self,
        name: str,
        items: Callable[[Exchange], Any] | KeyExpr,
        *,
        correlate_by: KeyExpr | None = None,
        chunk: int | None = None,
        on_item_failure: str | None = None,
    ) -> Flow:
        """Send the exchange's items (a non-empty list: ``items(exchange)``, or the payload at a path) one by one.

        The process steps up to the matching :meth:`aggregate` run on each item, as an exchange of its own
        (payload: the item; the parent's headers; properties ``split_index``, ``split_total``), on any
        worker of this flow. The correlation id is ``correlate_by`` read from the exchange, else the
        execution's id. Items travel ``chunk`` per message (default ``WEIR_SPLIT_CHUNK``). ``on_item_failure``:
        what a failed item does, said on the split as Camel does (``"stop"``: ``stopOnException``; ``"fail-parent"``:
        ``shareUnitOfWork``), or on the aggregate (:meth:`aggregate`); not differently on both.
        """
        if on_item_failure is not None and on_item_failure not in ITEM_FAILURE_RULES:
            message = (
                f"flow {self.name!r}, split {name!r}: on_item_failure must be one of {list(ITEM_FAILURE_RULES)}, got {on_item_failure!r}"
            )
            raise FlowDeclarationError(message)
        if self._open_split() is not None:
            message = f"flow {self.name!r}, split {name!r}: the split before it has no aggregate yet (splits do not nest)"
            raise FlowDeclarationError(message)
        if chunk is not None and chunk <= 0:
            message = f"flow {self.name!r}, split {name!r}: chunk must be positive, got {chunk}"
            raise FlowDeclarationError(message)
        read = items.read if isinstance(items, KeyExpr) else items
        return self._add(Step("split", name, split=Split(name, read, correlate_by, chunk, on_item_failure)))

    def aggregate(
        self,
        name: str,
        *,
        timeout_ms: int | None,
        inactivity_ms: int | None = None,
        complete_by: Sequence[str] = ("count", "flag"),
        correlate_by: KeyExpr | None = None,
        groups: str = ONE_SHOT,
        complete_size: int | None = None,
        complete_when: Callable[[list[Any]], bool] | None = None,
        complete_on: KeyExpr | Callable[[Exchange], Any] | None = None,
        on_item_failure: str | None = None,
        complete_interval_ms: int | None = None,
        timeout_from: KeyExpr | Callable[[Exchange], Any] | None = None,
        complete_on_new_group: bool = False,
        complete_at_batch_end: bool = False,
    ) -> Flow:
        """Merge the outcomes of the split's items, or (no split before it) group exchanges by ``correlate_by``;
        the exchange goes on with the merged result as its payload.

        After a split, the group completes when every item has an outcome (``count``; or up to the item
        flagged last, ``flag``). Without a split it is Camel's and Spring Integration's aggregator: exchanges
        with one ``correlate_by`` key are merged in arrival order, and the group completes after
        ``complete_size`` exchanges, when ``complete_when(payloads so far)`` is true, or with an exchange for
        which ``complete_on`` is true; ``groups="reopening"`` opens the key's next group with the next
        exchange ("batch every 3 per customer"), ``"one-shot"`` counts later ones as late. The exchange that
        reaches such an aggregate ends its execution there (completed); the group's result starts a new one,
        with the first exchange's headers and properties, its id ``<flow>:<aggregate>:<key>#<group number>``.

        Either kind also completes partial at ``timeout_ms`` after its start or after ``inactivity_ms`` without
        a new part, whichever comes first; or when an operator forces it (:func:`tables.aggregates.force_message`).
        ``timeout_ms`` must be said: None for no absolute deadline.

        After a split, an item whose step failed (its retries spent) is merged as ``failed`` and the others are
        waited for (``on_item_failure="continue"``). ``"stop"`` (Camel's ``stopOnException``) ends the group at the
        first failed item: the exchange goes on with a result of status ``failed``, reason ``item-failed``, naming
        the item (``failed_item``) and its cause (``error``); later items' outcomes are counted late, never merged.
        ``"fail-parent"`` (Camel's ``shareUnitOfWork``) ends it so too and fails the parent exchange as one: it is
        dead-lettered (reason ``item-failed``, the whole exchange) and its execution ends ``failed``. Items already
        handed to other workers still run: only their outcomes are ignored.

        ``complete_interval_ms`` (Camel's ``completionInterval``): every open group completes at each multiple of the
        period on the clock (reason ``interval``), all at once, not each after its own start. ``timeout_from`` (a
        group by key): the absolute timeout in ms of a group, read from the exchange that opens it (None: the
        aggregate's ``timeout_ms``), so that a key's successive groups may each have their own.
        ``complete_on_new_group`` (a group by key; Camel's ``completionOnNewCorrelationGroup``): an exchange that opens a
        group completes the group open in its partition (reason ``new-group``), so that one group is in progress per
        partition at a time: for input whose keys come in runs ("all of a customer's lines, then the next customer's").
        The order is a partition's, as Kafka keeps it: keys of different partitions do not complete each other. With
        ``groups="one-shot"`` a key met again after its group completed is late; ``"reopening"`` opens its next group.
        ``complete_at_batch_end`` (a group by key; Camel's ``completionFromBatchConsumer``): every group that a batch
        brought exchanges to completes at the end of that batch (reason ``batch-end``): a batch is what the aggregate's
        consumer had ready for one partition (at most ``WEIR_BATCH_SIZE`` records), so the grouping follows how the
        records arrive; after a crash the batch read again may be cut otherwise, each exchange still in one result.
        """
        where = f"flow {self.name!r}, aggregate {name!r}"
        correlates = correlate_by is not None
        open_split = self._open_split()
        after_split = open_split is not None
        said_on_split = open_split.split.on_item_failure if open_split is not None and open_split.split is not None else None
        if on_item_failure is not None and said_on_split is not None and on_item_failure != said_on_split:
            message = f"{where}: on_item_failure {on_item_failure!r} here, {said_on_split!r} on its split: say it once"
            raise FlowDeclarationError(message)
        on_item_failure = on_item_failure or said_on_split or CONTINUE_ON_FAILURE
        if not after_split and not correlates:
            message = f"{where}: an aggregate needs a split before it, or correlate_by= to group exchanges by a key"
            raise FlowDeclarationError(message)
        if after_split and (correlates or groups != ONE_SHOT or complete_size or complete_when or complete_on):
            message = (
                f"{where}: correlate_by, groups, complete_size, complete_when and complete_on belong to an aggregate "
                "without a split before it (a split's items complete by count and flag)"
            )
            raise FlowDeclarationError(message)
        if correlates and not (
            complete_size
            or complete_when
            or complete_on
            or timeout_ms
            or inactivity_ms
            or complete_interval_ms
            or timeout_from
            or complete_on_new_group
            or complete_at_batch_end
        ):
            message = f"{where}: a group by key needs a way to complete: complete_size, complete_when, complete_on or a timeout"
            raise FlowDeclarationError(message)
        unknown = sorted(set(complete_by) - {"count", "flag"})
        if unknown or not complete_by:
            message = f"{where}: complete_by must be a non-empty subset of ['count', 'flag'], got {list(complete_by)}"
            raise FlowDeclarationError(message)
        if on_item_failure not in ITEM_FAILURE_RULES:
            message = f"{where}: on_item_failure must be one of {list(ITEM_FAILURE_RULES)}, got {on_item_failure!r}"
            raise FlowDeclarationError(message)
        if timeout_from is not None and not correlates:
            message = f"{where}: timeout_from belongs to a group by key (correlate_by=): a split's group has one open"
            raise FlowDeclarationError(message)
        if (complete_on_new_group or complete_at_batch_end) and not correlates:
            knob = "complete_on_new_group" if complete_on_new_group else "complete_at_batch_end"
            message = f"{where}: {knob} belongs to a group by key (correlate_by=): a split's group completes by its items"
            raise FlowDeclarationError(message)
        if on_item_failure != CONTINUE_ON_FAILURE and not after_split:
            message = f"{where}: on_item_failure belongs to an aggregate after a split (a group by key has no failed items)"
            raise FlowDeclarationError(message)
        flag = _flag_of(complete_on) if isinstance(complete_on, KeyExpr) else complete_on
        read_timeout = timeout_from  # a KeyExpr reads None where the field is absent: the aggregate's own timeout then
        aggregate = Aggregate(
            name,
            timeout_ms,
            tuple(complete_by),
            inactivity_ms,
            correlate_by,
            groups,
            complete_size,
            complete_when,
            flag,
            on_item_failure,
            complete_interval_ms,
            read_timeout,
            complete_on_new_group,
            complete_at_batch_end,
        )
        try:
            aggregate.config(done_retention_ms=1)
        except ValueError as error:
            raise FlowDeclarationError(f"{where}: {error}") from None
        return self._add(Step("aggregate", name, aggregate=aggregate))

    def window(
        self,
        name: str,
        spec: WindowSpec | SessionSpec,
        *,
        key: KeyExpr | Callable[[Exchange], Any] | None = None,
        initial: Any = 0,
        fold: Callable[[Any, Any], Any] = lambda aggregate, _payload: aggregate + 1,
        timestamp: KeyExpr | Callable[[Exchange], Any] | None = None,
        emit: str = "final",
        merge: Callable[[Any, Any], Any] = operator.add,
    ) -> Flow:
        """Fold the exchanges' payloads into windows of event time per key (Kafka Streams' windowed aggregation as a
        step; the same windows as :class:`weir.Window`): ``spec`` tumbling or hopping (:class:`WindowSpec`) or sessions
        (:class:`SessionSpec`), ``fold(aggregate, payload)`` from ``initial`` (default: a count).

        ``key``: the windows' key (default: the exchange's key); ``timestamp``: the exchange's event time in ms
        (default: the timestamp of the record that started its execution). Stream time is each partition's of the
        window step's own topic; a record later than its windows' close (end + grace) is dead-lettered (reason
        ``late``). The exchange ends its execution at the window (completed). Each window's result, ``{"key",
        "start_ms", "end_ms", "value", "count", "final"}``, starts an execution of its own from the next step, keyed by
        the window's key, id ``<flow>:<window>:<key>@<start>`` (``emit="update"``: a result on every exchange the window
        takes, ``...#<count>``, then the final one).
        """
        where = f"flow {self.name!r}, window {name!r}"
        if not isinstance(spec, WindowSpec | SessionSpec):
            raise FlowDeclarationError(f"{where}: spec must be a WindowSpec or a SessionSpec, got {type(spec).__name__}")
        if emit not in ("final", "update"):
            raise FlowDeclarationError(f"{where}: emit is 'final' or 'update', got {emit!r}")
        read_time = _flag_of(timestamp) if isinstance(timestamp, KeyExpr) else timestamp  # None where the field is absent
        step = WindowStep(name, spec, key, initial, fold, read_time, emit, merge)
        return self._add(Step("window", name, window=step))

    def process(self, name: str, function: Callable[[Exchange], Any]) -> Flow:
        """Run ``function(exchange)``; it may change the exchange, and a value it returns (not None) becomes the payload."""
        return self._add(Step("process", name, function=function))

    def filter(self, name: str, predicate: Callable[[Exchange], Any]) -> Flow:
        """Drop the exchange when ``predicate`` is false: the execution ends, completed."""
        return self._add(Step("filter", name, function=predicate))

    def to(
        self,
        topic: str,
        name: str | None = None,
        *,
        key: KeyExpr | None = None,
        each: KeyExpr | Callable[[Exchange], Any] | None = None,
    ) -> Flow:
        """Send the payload (with headers) to ``topic``, keyed by the exchange's key.

        ``each``: send each payload of this list instead (read from the exchange; an empty list sends nothing).
        ``key``: the record key, read from each record's payload. The records join the exchange's transaction.
        """
        read = each.read if isinstance(each, KeyExpr) else each
        return self._add(Step("to", name or f"to-{topic}", topic=topic, key=key, each=read))

    def barrier(
        self,
        name: str,
        *,
        awaits: Sequence[str | Await],
        timeout_ms: int | None,
        correlate_by: KeyExpr | None = None,
        on_duplicate: OnDuplicate = REJECT,
        on_timeout: GiveUp = FAIL,
        on_failure: GiveUp = FAIL,
        memory: Memory = REMEMBER,
    ) -> Flow:
        """Wait until every awaited flow completed for the exchange's key, then go on unchanged.

        One exchange waits per key: another arriving while it waits is dead-lettered ``duplicate-waiter``
        (``on_duplicate="reject"``). ``"release-all"`` lets both wait, each released when its flows completed;
        ``"replace"`` lets the newcomer wait in place of the one waiting, which is dead-lettered ``superseded``.
        A redelivered copy of the same exchange is never a second waiter.

        At the timeout the exchange is dead-lettered ``timeout`` and its execution fails; ``on_timeout="continue"``
        lets it go on instead. A failed awaited execution fails it (``awaited-failed``); ``on_failure="continue"``
        lets it go on at once. Then, and whenever an await counts executions or asks for results, the exchange
        goes on with ``properties["barriers"][name] = {"status": "completed" | "timeout" | "failed", "error",
        "missing": [flows], "results": {flow: [payloads]}}``.

        A completion is remembered for the barrier's timeout (``memory="remember"``, seed 004's rule: a completion
        that came first releases whoever arrives on its key before the timeout, a second waiter a few seconds later
        included); ``memory="consume"`` lets the release it causes consume it (Spring Integration's barrier): a later
        waiter on the key waits for a completion of its own. A completion that finds no waiter is kept either way.
        """
        where = f"flow {self.name!r}, barrier {name!r}"
        if on_duplicate not in DUPLICATE_RULES:
            message = f"{where}: on_duplicate must be one of {list(DUPLICATE_RULES)}, got {on_duplicate!r}"
            raise FlowDeclarationError(message)
        if memory not in MEMORY_RULES:
            message = f"{where}: memory must be one of {list(MEMORY_RULES)}, got {memory!r}"
            raise FlowDeclarationError(message)
        for knob, value in (("on_timeout", on_timeout), ("on_failure", on_failure)):
            if value not in GIVE_UP_RULES:
                message = f"{where}: {knob} must be one of {list(GIVE_UP_RULES)}, got {value!r}"
                raise FlowDeclarationError(message)
        if not awaits:
            message = f"{where}: a barrier needs at least one await"
            raise FlowDeclarationError(message)
        if timeout_ms is None or timeout_ms <= 0:
            message = f"{where}: a timeout is mandatory and must be positive, got {timeout_ms!r}"
            raise FlowDeclarationError(message)
        normalized = tuple(Await(item) if isinstance(item, str) else item for item in awaits)
        sources = [item.source for item in normalized]
        twice = sorted({source for source in sources if sources.count(source) > 1})
        if twice:
            message = f"{where}: flow(s) {twice} awaited twice"
            raise FlowDeclarationError(message)
        keyless = [item.source for item in normalized if item.key is None and correlate_by is None]
        if keyless:
            message = f"{where}: await(s) of {keyless} have no key: give the barrier correlate_by= or each await a key"
            raise FlowDeclarationError(message)
        for index, item in enumerate(normalized):
            if item.distinct_by is not None and item.count is None:
                message = f"{where}: the await of {item.source!r} has distinct_by but no count"
                raise FlowDeclarationError(message)
            if isinstance(item.count, int) and (isinstance(item.count, bool) or item.count < 0):
                message = f"{where}: the await of {item.source!r} has count {item.count!r}, expected a non-negative int or a function"
                raise FlowDeclarationError(message)
            # Counted completions meet the waiter at its own key: an await whose key could differ would be relayed.
            waits_at_its_key = item.key is None or (correlate_by is None and index == 0)
            if item.count is not None and not waits_at_its_key:
                message = (
                    f"{where}: the await of {item.source!r} counts executions, so it must read the key the exchange waits "
                    "under: no key of its own, or be the first await of a barrier without correlate_by"
                )
                raise FlowDeclarationError(message)
        barrier = Barrier(name, normalized, timeout_ms, correlate_by, on_duplicate, on_timeout, on_failure, memory)
        return self._add(Step("barrier", name, barrier=barrier))

    def barriers(self) -> list[Barrier]:
        return [step.barrier for step in self.steps if step.barrier is not None]


def validate_flows(flows: Sequence[Flow]) -> dict[str, Flow]:
    """The flows by source topic, or :class:`FlowGraphError` naming the flows that cannot run together."""
    by_source: dict[str, Flow] = {}
    for flow in flows:
        if flow.source in by_source:
            message = f"flows {by_source[flow.source].name!r} and {flow.name!r} both read topic {flow.source!r}"
            raise FlowGraphError(message)
        by_source[flow.source] = flow
    names = [flow.name for flow in flows]
    if len(set(names)) != len(names):
        message = f"flow names must be unique, got {sorted(names)}"
        raise FlowGraphError(message)
    for flow in flows:
        split = flow._open_split()
        if split is not None:
            message = f"flow {flow.name!r}: split {split.name!r} has no aggregate after it"
            raise FlowGraphError(message)
    waits: dict[str, set[str]] = {flow.name: set() for flow in flows}
    for flow in flows:
        for barrier in flow.barriers():
            for awaited in barrier.awaits:
                target = by_source.get(awaited.source)
                if target is None:
                    message = f"flow {flow.name!r}, barrier {barrier.name!r}: awaits topic {awaited.source!r}, which no flow reads"
                    raise FlowGraphError(message)
                if target is flow:
                    message = f"flow {flow.name!r}, barrier {barrier.name!r}: a flow cannot await itself"
                    raise FlowGraphError(message)
                waits[flow.name].add(target.name)
    cycle = _find_cycle(waits)
    if cycle:
        message = f"flows wait for each other in a cycle: {' -> '.join(cycle)}"
        raise FlowGraphError(message)
    barrier_names = [barrier.name for flow in flows for barrier in flow.barriers()]
    if len(set(barrier_names)) != len(barrier_names):
        message = f"barrier names must be unique across flows, got {sorted(barrier_names)}"
        raise FlowGraphError(message)
    return by_source


def _find_cycle(waits: dict[str, set[str]]) -> list[str] | None:
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> list[str] | None:
        if name in visiting:
            return [*visiting[visiting.index(name) :], name]
        if name in done:
            return None
        visiting.append(name)
        for target in sorted(waits.get(name, ())):
            found = visit(target)
            if found:
                return found
        visiting.pop()
        done.add(name)
        return None

    for name in sorted(waits):
        found = visit(name)
        if found:
            return found
    return None
