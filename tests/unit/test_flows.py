"""Flow declarations: what the builder refuses at declaration, what validate_flows refuses at startup."""

from __future__ import annotations

from typing import Any

import pytest

from weir.app.flows import Await, Exchange, Flow, FlowDeclarationError, FlowGraphError, header, payload, validate_flows


def noop(exchange: Exchange) -> None:
    return None


def test_a_barrier_needs_an_await() -> None:
    with pytest.raises(FlowDeclarationError, match="flow 'd', barrier 'b': a barrier needs at least one await"):
        Flow("d", source="in").barrier("b", awaits=[], timeout_ms=1000, correlate_by=header("k"))


@pytest.mark.parametrize("timeout_ms", [None, 0, -5])
def test_a_barrier_needs_a_timeout(timeout_ms: int | None) -> None:
    with pytest.raises(FlowDeclarationError, match="a timeout is mandatory"):
        Flow("d", source="in").barrier("b", awaits=["kitchen"], timeout_ms=timeout_ms, correlate_by=header("k"))


def test_an_await_needs_a_key() -> None:
    with pytest.raises(FlowDeclarationError, match=r"await\(s\) of \['payment'\] have no key"):
        Flow("d", source="in").barrier("b", awaits=[Await("kitchen", key=header("k")), "payment"], timeout_ms=1000)


def test_the_same_flow_cannot_be_awaited_twice() -> None:
    with pytest.raises(FlowDeclarationError, match=r"flow\(s\) \['kitchen'\] awaited twice"):
        Flow("d", source="in").barrier(
            "b", awaits=["kitchen", Await("kitchen", key=payload("id"))], timeout_ms=1000, correlate_by=header("k")
        )


def test_a_barrier_rejects_a_second_waiter_unless_told_otherwise() -> None:
    [default] = Flow("d", source="in").barrier("b", awaits=["kitchen"], timeout_ms=1000, correlate_by=header("k")).barriers()
    assert default.on_duplicate == "reject"
    for rule in ("release-all", "replace"):
        flow = Flow("d", source="in").barrier("b", awaits=["kitchen"], timeout_ms=1000, correlate_by=header("k"), on_duplicate=rule)
        assert flow.barriers()[0].on_duplicate == rule


def test_an_unknown_duplicate_rule_is_refused_where_declared() -> None:
    with pytest.raises(
        FlowDeclarationError, match=r"flow 'd', barrier 'b': on_duplicate must be one of \['reject', 'release-all', 'replace'\], got 'last'"
    ):
        Flow("d", source="in").barrier("b", awaits=["kitchen"], timeout_ms=1000, correlate_by=header("k"), on_duplicate="last")  # type: ignore[arg-type]


def test_every_await_may_have_its_own_key_without_correlate_by() -> None:
    flow = Flow("d", source="in").barrier(
        "b", awaits=[Await("kitchen", key=header("k")), Await("payment", key=payload("order.id"))], timeout_ms=1
    )
    [barrier] = flow.barriers()
    assert [barrier.key_for(item).description for item in barrier.awaits] == ["header 'k'", "payload 'order.id'"]


def test_an_await_of_a_topic_no_flow_reads_is_refused_at_startup() -> None:
    flows = [Flow("d", source="in").barrier("b", awaits=["nowhere"], timeout_ms=1000, correlate_by=header("k"))]
    with pytest.raises(FlowGraphError, match="flow 'd', barrier 'b': awaits topic 'nowhere', which no flow reads"):
        validate_flows(flows)


def test_a_flow_awaiting_itself_is_refused_at_startup() -> None:
    flows = [Flow("d", source="in").barrier("b", awaits=["in"], timeout_ms=1000, correlate_by=header("k"))]
    with pytest.raises(FlowGraphError, match="flow 'd', barrier 'b': a flow cannot await itself"):
        validate_flows(flows)


def test_a_cycle_of_waits_is_refused_at_startup_naming_the_flows() -> None:
    flows = [
        Flow("a", source="ta").barrier("wa", awaits=["tb"], timeout_ms=1000, correlate_by=header("k")),
        Flow("b", source="tb").barrier("wb", awaits=["tc"], timeout_ms=1000, correlate_by=header("k")),
        Flow("c", source="tc").barrier("wc", awaits=["ta"], timeout_ms=1000, correlate_by=header("k")),
    ]
    with pytest.raises(FlowGraphError, match="flows wait for each other in a cycle: a -> b -> c -> a"):
        validate_flows(flows)


def test_a_valid_graph_maps_sources_to_flows() -> None:
    kitchen = Flow("kitchen", source="kitchen").process("cook", noop)
    dispatch = Flow("dispatch", source="in").barrier("b", awaits=["kitchen"], timeout_ms=1000, correlate_by=header("k"))
    assert validate_flows([kitchen, dispatch]) == {"kitchen": kitchen, "in": dispatch}


def test_two_flows_cannot_read_one_topic() -> None:
    with pytest.raises(FlowGraphError, match="both read topic 'x'"):
        validate_flows([Flow("a", source="x"), Flow("b", source="x")])


def test_step_names_are_unique_within_a_flow() -> None:
    with pytest.raises(FlowDeclarationError, match="two steps are named 'p'"):
        Flow("a", source="x").process("p", noop).process("p", noop)


def test_key_expressions_read_headers_and_payload_paths_or_give_none() -> None:
    exchange = Exchange(payload={"order": {"id": 17, "lines": [{"sku": "v"}]}}, headers={"order-id": "o-1"})
    assert header("order-id")(exchange) == "o-1"
    assert header("missing")(exchange) is None
    assert payload("order.id")(exchange) == "17"
    assert payload("order.lines.0.sku")(exchange) == "v"
    assert payload("order.nope")(exchange) is None
    assert payload("order")(exchange) is None, "a key is a single value, not an object"
    assert payload("order.lines.sku")(exchange) is None, "a name is no index into a list"
    assert payload("ticket")(Exchange(payload=["not", "an", "object"])) is None, "a payload of another shape has no key"
    assert payload("ticket")(Exchange(payload="a string")) is None


def test_split_and_aggregate_make_a_segment_of_the_process_steps_between_them() -> None:
    flow = (
        Flow("orders", source="orders")
        .process("check", noop)
        .split("items", payload("items"), correlate_by=payload("order_id"), chunk=5)
        .process("price", noop)
        .process("tax", noop)
        .aggregate("total", timeout_ms=1000)
        .to("priced")
    )
    [segment] = flow.segments()
    assert [flow.steps[index].name for index in segment.item_steps] == ["price", "tax"]
    assert flow.steps[segment.aggregate_index].name == "total"
    split = flow.steps[segment.split_index].split
    assert split is not None
    assert split.chunk == 5
    assert split.items(Exchange(payload={"items": [1, 2]})) == [1, 2]
    validate_flows([flow])


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda f: f.aggregate("a", timeout_ms=10), "an aggregate needs a split before it"),
        (lambda f: f.split("s", payload("items")).split("t", payload("items")), "splits do not nest"),
        (lambda f: f.split("s", payload("items")).filter("f", noop), "only process steps run \\(per item\\), got a filter step"),
        (lambda f: f.split("s", payload("items")).to("out"), "got a to step"),
        (
            lambda f: f.split("s", payload("items")).barrier("b", awaits=["x"], timeout_ms=10, correlate_by=header("k")),
            "got a barrier step",
        ),
        (lambda f: f.split("s", payload("items")).aggregate("a", timeout_ms=0), "timeout_ms must be a positive integer or None"),
        (
            lambda f: f.split("s", payload("items")).aggregate("a", timeout_ms=None, inactivity_ms=-1),
            "inactivity_ms must be a positive integer or None",
        ),
        (lambda f: f.split("s", payload("items")).aggregate("a", timeout_ms=10, complete_by=["size"]), "complete_by must be"),
        (lambda f: f.split("s", payload("items"), chunk=0), "chunk must be positive"),
    ],
)
def test_a_wrong_split_or_aggregate_is_refused_at_declaration(build: Any, expected: str) -> None:
    with pytest.raises(FlowDeclarationError, match=expected):
        build(Flow("orders", source="orders"))


def test_a_split_without_its_aggregate_is_refused_at_startup() -> None:
    flow = Flow("orders", source="orders").split("items", payload("items")).process("price", noop)
    with pytest.raises(FlowGraphError, match="flow 'orders': split 'items' has no aggregate after it"):
        validate_flows([flow])


def test_a_flow_selection_is_its_own_stage_and_consumer_group(monkeypatch: pytest.MonkeyPatch) -> None:
    from weir.app.settings import load_settings

    monkeypatch.setenv("WEIR_APP_ID", "shop")
    monkeypatch.setenv("WEIR_AGENTS", "flows")
    assert load_settings().group_id == "shop-flows"
    monkeypatch.setenv("WEIR_FLOWS_RUN", "payment, kitchen,dispatch out")
    settings = load_settings()
    assert settings.flows_run == ("dispatch out", "kitchen", "payment")
    assert settings.group_id == "shop-flows.dispatch_out.kitchen.payment", "letters, digits, '.', '_', '-' only: it names topics"


def test_an_aggregate_without_a_split_groups_by_a_key_and_needs_a_way_to_complete() -> None:
    flow = Flow("c", source="in").aggregate("by-customer", correlate_by=payload("customer"), complete_size=3, timeout_ms=None)
    [step] = flow.steps
    assert step.aggregate is not None
    assert step.aggregate.correlates
    assert flow.correlation_aggregates() == [0]
    assert flow.segments() == []
    config = step.aggregate.config(done_retention_ms=5)
    assert (config.complete_size, config.groups, config.timeout_ms) == (3, "one-shot", None)
    with pytest.raises(FlowDeclarationError, match="needs a way to complete"):
        Flow("c", source="in").aggregate("a", correlate_by=payload("customer"), timeout_ms=None)
    with pytest.raises(FlowDeclarationError, match="needs a split before it, or correlate_by"):
        Flow("c", source="in").aggregate("a", timeout_ms=1_000)
    with pytest.raises(FlowDeclarationError, match="groups must be 'one-shot' or 'reopening'"):
        Flow("c", source="in").aggregate("a", correlate_by=payload("k"), complete_size=2, groups="sometimes", timeout_ms=None)


def test_a_split_aggregate_refuses_the_knobs_of_a_group_by_key() -> None:
    with pytest.raises(FlowDeclarationError, match="belong to an aggregate without a split before it"):
        Flow("c", source="in").split("s", payload("items")).aggregate("a", timeout_ms=1_000, complete_size=3)


def test_complete_on_reads_a_flag_and_an_absent_one_is_false() -> None:
    flow = Flow("c", source="in").aggregate("a", correlate_by=payload("k"), complete_on=payload("end"), timeout_ms=1_000)
    aggregate = flow.steps[0].aggregate
    assert aggregate is not None
    assert aggregate.complete_on is not None
    assert aggregate.complete_on(Exchange(payload={"k": "x", "end": True}))
    assert not aggregate.complete_on(Exchange(payload={"k": "x"}))


def test_a_counted_await_must_read_the_key_the_exchange_waits_under() -> None:
    counted = Await("kitchen", key=payload("id"), count=payload("n"), distinct_by=payload("flavour"), results=True)
    [first] = Flow("d", source="in").barrier("b", awaits=[counted], timeout_ms=1).barriers()
    assert first.reports, "an await that counts or asks for results tells the exchange how its wait ended"
    [keyless] = Flow("d", source="in").barrier("b", awaits=[Await("kitchen", count=2)], timeout_ms=1, correlate_by=header("k")).barriers()
    assert keyless.awaits[0].count == 2
    with pytest.raises(FlowDeclarationError, match="counts executions, so it must read the key the exchange waits under"):
        Flow("d", source="in").barrier("b", awaits=[counted], timeout_ms=1, correlate_by=header("k"))
    with pytest.raises(FlowDeclarationError, match="counts executions"):
        Flow("d", source="in").barrier("b", awaits=[Await("pay", key=header("k")), counted], timeout_ms=1)


@pytest.mark.parametrize(
    ("awaited", "expected"),
    [
        (Await("kitchen", distinct_by=payload("flavour")), "has distinct_by but no count"),
        (Await("kitchen", count=-1), "has count -1, expected a non-negative int or a function"),
    ],
)
def test_a_wrong_count_is_refused_where_declared(awaited: Await, expected: str) -> None:
    with pytest.raises(FlowDeclarationError, match=expected):
        Flow("d", source="in").barrier("b", awaits=[awaited], timeout_ms=1, correlate_by=header("k"))


def test_timeout_and_failure_rules_are_checked_and_default_to_fail() -> None:
    [plain] = Flow("d", source="in").barrier("b", awaits=["kitchen"], timeout_ms=1, correlate_by=header("k")).barriers()
    assert (plain.on_timeout, plain.on_failure, plain.reports) == ("fail", "fail", False)
    flow = Flow("d", source="in").barrier("b", awaits=["kitchen"], timeout_ms=1, correlate_by=header("k"), on_timeout="continue")
    assert flow.barriers()[0].reports
    with pytest.raises(FlowDeclarationError, match=r"on_failure must be one of \['fail', 'continue'\], got 'skip'"):
        Flow("d", source="in").barrier("b", awaits=["kitchen"], timeout_ms=1, correlate_by=header("k"), on_failure="skip")  # type: ignore[arg-type]


def test_a_to_step_may_send_each_of_a_list_keyed_by_each_record_and_a_flow_may_name_its_executions() -> None:
    flow = Flow("d", source="in", id_by=payload("ticket")).to("out", "each-line", each=payload("lines"), key=payload("sku"))
    [step] = flow.steps
    assert step.each is not None
    assert step.key is not None
    assert step.each(Exchange(payload={"lines": [{"sku": "a"}]})) == [{"sku": "a"}]
    assert flow.id_by is not None
    assert flow.id_by(Exchange(payload={"ticket": "t-1"})) == "t-1"
