"""`python -m app.outbox_relay`: the outbox relay as its own process; SIGTERM or SIGINT end it after the current round."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import signal
import sys
from collections.abc import Sequence

from weir.app.edge import CommandParser, add_log_level, command_edge, configure_logging
from weir.app.kafka_io import check_broker, ensure_topics
from weir.app.outbox import OutboxRelay, open_outbox
from weir.app.settings import SettingError, load_settings

__all__ = ["main"]

log = logging.getLogger("weir.outbox")


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    settings = load_settings()
    parser = CommandParser(prog="python -m app.outbox_relay", description=__doc__)
    parser.add_argument(
        "--db", default=settings.outbox_db, help="outbox: a SQLite path or a postgresql:// URL (default: WEIR_OUTBOX_DB = %(default)s)"
    )
    parser.add_argument("--topic", default=settings.topic("outbox"), help="topic of rows without one (default: %(default)s)")
    parser.add_argument(
        "--batch", type=int, default=settings.outbox_batch, help="rows per publish round (default: WEIR_OUTBOX_BATCH = %(default)s)"
    )
    parser.add_argument(
        "--source",
        default=None,
        help="the weir-outbox-source header and transactional id; set it when outboxes share a topic (default: the database name)",
    )
    parser.add_argument("--bootstrap", default=settings.bootstrap, help="Kafka host:port (default: KAFKA_BOOTSTRAP = %(default)s)")
    parser.add_argument(
        "--partitions", type=int, default=settings.partitions, help="partitions if the topic must be created (default: %(default)s)"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=settings.outbox_metrics_port,
        help="serve the relay's Prometheus metrics at http://HOST:PORT/metrics; 0: none (default: WEIR_OUTBOX_METRICS_PORT = %(default)s)",
    )
    parser.add_argument(
        "--metrics-host", default=settings.web_host, help="the address /metrics listens on (default: WEIR_WEB_HOST = %(default)s)"
    )
    parser.add_argument(
        "--safety-timeout",
        type=float,
        default=30.0,
        help="seconds a sleeping relay waits before re-checking the outbox: a safety net, not the wake mechanism (default: %(default)s)",
    )
    add_log_level(parser)
    return parser.parse_args(argv)


async def _run(arguments: argparse.Namespace) -> None:
    try:
        outbox = open_outbox(arguments.db, **({"source": arguments.source} if arguments.source else {}))
    except Exception as error:  # sqlite3's or psycopg's, at the start: the --db (WEIR_OUTBOX_DB) to check, in one line
        why = " ".join(str(error).split())
        where = re.sub(r"://([^:/@]*):[^@/]*@", r"://\1:***@", arguments.db)  # never a password
        raise SettingError(f"cannot open the outbox {where!r} (--db, WEIR_OUTBOX_DB): {type(error).__name__}: {why}") from None
    relay = OutboxRelay(
        outbox,
        bootstrap=arguments.bootstrap,
        topic=arguments.topic,
        batch_size=arguments.batch,
        safety_timeout_s=arguments.safety_timeout,
    )
    if arguments.metrics_port:
        # Imported only here: app.metrics loads Faust's machinery (app.engine), which a relay without metrics does not need.
        from weir.app import metrics

        metrics.watch_outbox_relay(relay)
        metrics.serve(arguments.metrics_host, arguments.metrics_port)
        log.info("outbox relay metrics at http://%s:%d/metrics", arguments.metrics_host, arguments.metrics_port)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, relay.stop)
    try:
        await check_broker(arguments.bootstrap)
        await ensure_topics(arguments.bootstrap, [arguments.topic], arguments.partitions)
        await relay.run()
    finally:
        outbox.close()


def main(argv: Sequence[str] | None = None) -> int:
    with command_edge("python -m app.outbox_relay"):
        arguments = _arguments(argv)
        configure_logging(arguments.log_level)
        asyncio.run(_run(arguments))
    return 0


if __name__ == "__main__":
    sys.exit(main())
