"""A payment's key goes once it is final (committed, voided or rejected) and the done retention has passed; a capture
still open never goes; a phase seen again before then changes nothing; a capture that comes after the key went
charges nothing (the pure core, shop/state.py; the stage on the test driver: tests/unit/shop/test_payments_stage.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from shop.cards import CardRef
from shop.state import (
    CAPTURED,
    COMMITTED,
    FINAL_PAYMENT_STATES,
    REJECTED,
    VOIDED,
    Capture,
    Payment,
    Send,
    late_capture,
    on_capture,
    on_payment_deadline,
    on_settle,
    payment_deadlines,
    payment_due,
)

PROPERTY = settings(max_examples=300, deadline=None, database=None)
CARD = CardRef("tok_abc", "1111", True)
BAD_CARD = CardRef("tok_bad", "1112", False)  # failed the screen's Luhn check: the gateway rejects it
RETENTION_MS = 600_000
#: the order's deadline, as the claims stage gives its open and its capture
DEADLINE_MS = 30_000


def _capture(card: CardRef = CARD, deadline_ms: int | None = DEADLINE_MS) -> Capture:
    return Capture("day/s/1", 500, "s/1/o-1", card, deadline_ms)


def _captured(now_ms: int = 1_000) -> Payment:
    payment, _ = on_capture(None, _capture(), 1, 0.0, now_ms)
    assert payment.state == CAPTURED
    return payment


def test_a_settled_payment_files_its_deadline_at_settle_time_plus_the_retention() -> None:
    captured = _captured()
    for commit, state in ((True, COMMITTED), (False, VOIDED)):
        settled, sends, error = on_settle(captured, "day/s/1", commit, now_ms=45_000)
        assert settled is not None
        assert (settled.state, error, [send.value["phase"] for send in sends]) == (state, None, [state])
        assert payment_deadlines(captured, settled, RETENTION_MS) == (45_000 + RETENTION_MS,)
        assert payment_due(settled, RETENTION_MS) == 45_000 + RETENTION_MS


def test_a_payment_settled_before_its_order_s_deadline_is_kept_until_the_deadline_plus_the_retention() -> None:
    settled, _, _ = on_settle(_captured(), "day/s/1", True, now_ms=2_000)
    assert settled is not None
    assert payment_deadlines(_captured(), settled, RETENTION_MS) == (DEADLINE_MS + RETENTION_MS,)
    assert on_payment_deadline(settled, 2_000 + RETENTION_MS, RETENTION_MS) is settled, "the capture could still come again"


def test_a_rejected_card_s_payment_is_final_and_files_its_deadline_at_once() -> None:
    rejected, _ = on_capture(None, _capture(BAD_CARD), 1, 0.0, now_ms=40_000)
    assert rejected.state == REJECTED
    assert payment_deadlines(None, rejected, RETENTION_MS) == (40_000 + RETENTION_MS,)
    assert on_payment_deadline(rejected, 40_000 + RETENTION_MS, RETENTION_MS) is None


def test_at_its_deadline_the_key_is_deleted_and_not_before() -> None:
    settled, _, _ = on_settle(_captured(), "day/s/1", False, now_ms=45_000)
    assert settled is not None
    due = 45_000 + RETENTION_MS
    assert on_payment_deadline(settled, due - 1, RETENTION_MS) is settled
    assert on_payment_deadline(settled, due, RETENTION_MS) is None
    assert on_payment_deadline(settled, due + 10**9, RETENTION_MS) is None


def test_a_captured_payment_files_no_expiry_and_never_goes() -> None:
    captured = _captured()
    assert payment_deadlines(None, captured, RETENTION_MS) == ()
    assert payment_due(captured, RETENTION_MS) is None
    assert on_payment_deadline(captured, 10**15, RETENTION_MS) is captured
    assert CAPTURED not in FINAL_PAYMENT_STATES


def test_a_redelivered_settle_before_expiry_changes_nothing_and_files_nothing() -> None:
    settled, _, _ = on_settle(_captured(), "day/s/1", True, now_ms=45_000)
    assert settled is not None
    again, sends, error = on_settle(settled, "day/s/1", True, now_ms=46_000)
    assert (again, sends, error) == (settled, [], None)
    assert payment_deadlines(settled, again, RETENTION_MS) == (), "the deadline filed at the settle stands, not moved"
    assert late_capture(settled, _capture(), 10**15, RETENTION_MS) is None, "a capture that finds its payment is never late"
    assert on_capture(settled, _capture(), 1, 0.0, now_ms=46_000) == (settled, []), "and it is absorbed as before"


def test_a_capture_after_its_deadline_and_the_retention_with_no_payment_is_refused() -> None:
    capture = _capture()
    assert late_capture(None, capture, DEADLINE_MS + RETENTION_MS - 1, RETENTION_MS) is None, "late for the dispatch, still taken"
    refused = late_capture(None, capture, DEADLINE_MS + RETENTION_MS, RETENTION_MS)
    assert refused is not None
    assert "'day/s/1'" in refused
    assert "nothing is captured" in refused
    assert late_capture(None, _capture(deadline_ms=None), 10**15, RETENTION_MS) is None, "a capture without a deadline is never late"


def test_a_capture_s_deadline_travels_in_its_message_and_stays_with_its_payment() -> None:
    capture = _capture()
    message = capture.to_message()
    assert message["deadline_ms"] == DEADLINE_MS
    assert Capture.from_message(message) == capture
    legacy = {name: value for name, value in message.items() if name != "deadline_ms"}
    assert Capture.from_message(legacy).deadline_ms is None, "a capture written before the deadline travelled"
    assert "deadline_ms" not in _capture(deadline_ms=None).to_message()
    payment = _captured()
    assert payment.deadline_ms == DEADLINE_MS
    assert Payment.from_dict(payment.to_dict()) == payment
    stored_before = {name: value for name, value in payment.to_dict().items() if name != "deadline_ms"}
    assert Payment.from_dict(stored_before).deadline_ms is None


@dataclass
class Gateway:
    """The payments stage for one ticket, as the keyed runtime runs it: the payment, its filed deadlines, and what it
    logged (``shop.transactions``) and answered (``shop.payment-answers``)."""

    retention_ms: int
    payment: Payment | None = None
    filed: list[int] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    answers: int = 0
    refused_late: int = 0
    deleted_at: int | None = None

    def capture(self, capture: Capture, now: int) -> None:
        if late_capture(self.payment, capture, now, self.retention_ms) is not None:
            self.refused_late += 1
            return
        previous = self.payment
        self.payment, sends = on_capture(previous, capture, 1, 0.5, now)
        self.record(previous, sends)

    def settle(self, commit: bool, now: int) -> None:
        previous = self.payment
        settled, sends, _ = on_settle(previous, "day/s/1", commit, now)
        self.payment = settled if settled is not None else previous
        self.record(previous, sends)

    def record(self, previous: Payment | None, sends: list[Send]) -> None:
        for send in sends:
            if send.to == "transactions":
                self.phases.append(send.value["phase"])
            else:
                self.answers += 1
        self.filed += payment_deadlines(previous, self.payment, self.retention_ms)

    def tick(self, now: int) -> None:
        """The runtime's walk: each filed deadline that passed runs ``on_deadline`` on the key's state, if any."""
        for due in [due for due in self.filed if due <= now]:
            self.filed.remove(due)
            if self.payment is not None:
                later = payment_due(self.payment, self.retention_ms)
                if later is not None and later > now:
                    self.filed.append(later)  # the entry moved to a later second: filed again there
                    continue
                self.payment = on_payment_deadline(self.payment, now, self.retention_ms)
                if self.payment is None:
                    self.deleted_at = now


EVENTS = st.lists(
    st.tuples(st.integers(min_value=0, max_value=400_000), st.sampled_from(["capture", "bad capture", "commit", "void", "tick"])),
    max_size=30,
)


@PROPERTY
@given(
    events=EVENTS,
    deadline_ms=st.integers(min_value=0, max_value=200_000),
    retention_ms=st.sampled_from([0, 1, 1_000, 250_000]),
)
def test_whatever_comes_again_and_whenever_the_card_is_charged_at_most_once_and_only_final_payments_go(
    events: list[tuple[int, str]], deadline_ms: int, retention_ms: int
) -> None:
    """One ticket's capture (sent again any number of times, by a replay: always with its order's deadline), its commits
    and voids, and ticks, at any times: one capture or rejection is logged at most, a captured payment is never
    deleted, and a key is deleted only once final and past its due (the deadline filed when it became final)."""
    gateway = Gateway(retention_ms)
    now = 0
    for gap, kind in events:
        now += gap
        before = gateway.payment
        if kind in ("capture", "bad capture"):
            gateway.capture(_capture(BAD_CARD if kind == "bad capture" else CARD, deadline_ms), now)
        elif kind in ("commit", "void"):
            gateway.settle(kind == "commit", now)
        else:
            gateway.tick(now)
            if before is not None and gateway.payment is None:
                assert before.state in FINAL_PAYMENT_STATES, f"a {before.state} payment was deleted"
                due = payment_due(before, retention_ms)
                assert due is not None
                assert now >= due >= deadline_ms + retention_ms
        if before is not None and gateway.payment is not None and before.state in FINAL_PAYMENT_STATES:
            assert gateway.payment == before, "a final payment changes no more"
        assert sum(1 for phase in gateway.phases if phase in (CAPTURED, REJECTED)) <= 1, f"charged again: {gateway.phases}"
        assert gateway.phases.count(COMMITTED) + gateway.phases.count(VOIDED) <= 1, f"settled twice: {gateway.phases}"
    if gateway.payment is not None and gateway.payment.state in FINAL_PAYMENT_STATES:
        assert payment_due(gateway.payment, retention_ms) in gateway.filed, "a final payment has its deadline filed"
    if gateway.payment is not None and gateway.payment.state == CAPTURED:
        assert gateway.filed == [], "a capture still open files no expiry"
