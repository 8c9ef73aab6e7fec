"""Operator commands sent to a running aggregator: ``python -m app.control force complete|discard --topic T [--key K]``.

A force goes to the aggregate stage's input topic (the pipeline's ``item-results``, a flow aggregate's results
topic), in stream order with the outcomes: for one correlation id (keyed by it, so it lands on the group's
partition), or for every open group (sent to every partition). See :func:`tables.aggregates.force_message`.
"""

from __future__ import annotations

import asyncio
import sys

from weir.app.codec import dumps
from weir.app.edge import CommandParser, add_log_level, command_edge, configure_logging
from weir.app.kafka_io import check_broker, groups_reading, produce, produce_everywhere
from weir.app.settings import SettingError, default_bootstrap
from weir.tables.aggregates import FORCE_ACTIONS, force_message

__all__ = ["send_force", "main"]


async def send_force(bootstrap: str, topic: str, action: str, correlation_id: str | None = None) -> int:
    """Send a force to ``topic``; returns how many records went out (one, or one per partition).

    Refused (:class:`app.settings.SettingError`) when no stage reads ``topic``: no such topic (sending would create it),
    or no consumer group has committed an offset on it; the force would wait there, unread.
    """
    await check_broker(bootstrap)
    readers = await groups_reading(bootstrap, topic)
    if readers is None:
        raise SettingError(f"no topic {topic!r} on {bootstrap}: expected the aggregate stage's input topic (<prefix>.item-results)")
    if not readers:
        raise SettingError(f"no stage reads {topic!r} (no consumer group has committed an offset on it): the force would wait unread")
    value = dumps(force_message(action, correlation_id))
    if correlation_id is not None:
        return await produce(bootstrap, topic, [(correlation_id.encode(), value)])
    return await produce_everywhere(bootstrap, topic, value)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m app.control", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    force = commands.add_parser("force", help="force-complete or force-discard open aggregate groups")
    force.add_argument("action", choices=FORCE_ACTIONS)
    force.add_argument("--topic", required=True, help="the aggregate stage's input topic (the pipeline's: <prefix>.item-results)")
    force.add_argument("--key", default=None, help="one correlation id (default: every open group)")
    force.add_argument("--bootstrap", default=None, help="default: KAFKA_BOOTSTRAP, else 127.0.0.1:$WEIR_KAFKA_PORT")
    add_log_level(force, default="warning")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    with command_edge(parser.prog):
        sent = asyncio.run(send_force(args.bootstrap or default_bootstrap(), args.topic, args.action, args.key))
    print(f"force {args.action} sent to {args.topic} ({sent} record{'s' if sent != 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
