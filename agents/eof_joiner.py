"""EOF joiner: joins a client's totals (from the aggregator) with its price list (from the gateway) into its report."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.eof_common import ClientStates, join_topic
from app.core import InvalidMessage, app, handle_events, now_ms
from app.ticks import tick_every
from tables.eof import ClientJoin, Totals, is_count, on_join_cleanup, on_joiner_tick, on_prices, on_totals, parse_prices
from tables.eof_joiner_tables import joins, joins_deadlines

__all__ = ["eof_joiner"]

AGENT = "eof_joiner"
clients = ClientStates(joins, joins_deadlines, ClientJoin.from_dict, agent=AGENT, step="join")


def _totals(message: dict[str, Any], client: str) -> Totals:
    batches, orders, scoops = message.get("batches"), message.get("orders"), message.get("scoops")
    if not (isinstance(batches, int) and isinstance(orders, int) and isinstance(scoops, dict)) or not all(
        map(is_count, [batches, orders, *scoops.values()])
    ):
        raise InvalidMessage(
            f"eof joiner: totals of client {client!r} need 'batches', 'orders' and 'scoops' (flavour -> scoops), "
            "non-negative integers below 2**53"
        )
    return Totals(batches, orders, {str(flavour): count for flavour, count in scoops.items()})


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict):
        raise InvalidMessage(f"eof joiner: a message must be a JSON object, got {type(message).__name__}")
    now = now_ms()
    kind = message.get("kind")
    if kind == "tick":
        await clients.tick(event, now, on_joiner_tick)
        return
    client = message.get("client")
    if not isinstance(client, str) or not client:
        raise InvalidMessage(f"eof joiner: 'client' must be a non-empty string, got {client!r:.60}")
    previous = clients.load(client)
    if kind == "prices":
        prices = parse_prices(message.get("prices"))
        if prices is None:
            raise InvalidMessage(
                f"eof joiner: 'prices' of client {client!r} must map flavours to non-negative integers below 2**53 (cents per scoop)"
            )
        transition = on_prices(previous, client, prices, now)
    elif kind == "totals":
        transition = on_totals(previous, client, _totals(message, client), now)
    elif kind == "cleanup":
        transition = on_join_cleanup(previous, client, now)
    else:
        raise InvalidMessage(f"eof joiner: 'kind' must be 'prices', 'totals', 'cleanup' or 'tick', got {kind!r:.60}")
    await clients.apply(event, client, previous, transition)


@app.agent(join_topic)
async def eof_joiner(stream: StreamT[bytes]) -> None:
    """Reads each client's price list, its totals, the controller's cleanup, and ticks, keyed by client."""
    await handle_events(stream, agent=AGENT, what="eof joiner: message", handler=_handle)


tick_every(join_topic)
