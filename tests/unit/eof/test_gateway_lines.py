"""The EOF gateway's files (app/jsonlines.py): a line that is not UTF-8 is one record the job drops, not the file's end."""

from __future__ import annotations

import hashlib
from pathlib import Path

from examples.eof_orders import ORDERS
from weir import Settings, TestDriver
from weir.app.jsonlines import read_lines


def test_a_line_that_is_not_utf8_is_kept_as_one_unreadable_record_and_the_others_go_on(tmp_path: Path) -> None:
    bad = b"\xff\xfe card 4929 1234 5678 9012"
    good = b'{"order_id": "o-1", "time": "12:00", "items": [{"flavour": "vanilla", "scoops": 2}]}'
    path = tmp_path / "client-1.jsonl"
    path.write_bytes(good + b"\n" + bad + b"\n" + good.replace(b"o-1", b"o-2") + b"\n")
    lines = read_lines(path)
    assert lines[0] == good.decode()
    assert lines[2] == good.decode().replace("o-1", "o-2")
    unreadable = lines[1]
    assert isinstance(unreadable, dict)
    assert unreadable["unreadable"].startswith("not UTF-8 text")
    assert (unreadable["line"], unreadable["size_bytes"], unreadable["sha256"]) == (2, len(bad), hashlib.sha256(bad).hexdigest())
    assert "4929" not in str(unreadable), "never the line's bytes"
    with TestDriver(settings=Settings(partitions=2), eof_jobs={"": ORDERS}) as driver:
        report = driver.eof_client("client-1", lines, batch_size=1)
    assert report is not None
    assert (report["status"], report["orders"], report["batches"]) == ("complete", 2, 2)  # the unreadable line forwarded nothing
