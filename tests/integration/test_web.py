"""The /weir/ views of running workers: JSON for tools (urllib) and HTML for people (a real headless Chromium)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiokafka import AIOKafkaProducer

from tests.conftest import ROOT
from tests.integration.conftest import Pipeline
from weir.app.kafka_io import ensure_topics, produce, produce_json
from weir.app.web import weir_partition

#: one pytest process runs the module, so that its worker and browser (module fixtures) start once
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("web")]

TOPICS = ("orders", "items", "item-results", "aggregates", "dead-letters")
XSS = "<script>alert(1)</script>"
OPEN_GROUPS = [f"g-{number}" for number in range(8)] + [XSS]
COMPLETED_GROUP = "g-done"
POISON = b'{"kind": "item", <script>alert(2)</script> not JSON'


def get(url: str, *, accept: str = "application/json", method: str = "GET") -> tuple[int, Any, dict[str, str]]:
    """Status, decoded body (JSON when it is JSON, else text) and headers of one request."""
    request = urllib.request.Request(url, method=method, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            status, raw, headers = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        status, raw, headers = error.code, error.read(), dict(error.headers)
    text = raw.decode()
    try:
        return status, json.loads(text), headers
    except ValueError:
        return status, text, headers


def base(worker: Any) -> str:
    return f"http://127.0.0.1:{worker.web_port}"


def wait_for(condition: Any, *, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = condition()
        except (OSError, KeyError, TypeError) as error:
            last = error
        else:
            if last:
                return last
        time.sleep(0.5)
    pytest.fail(f"{what}: not true after {timeout_s}s (last: {last!r:.2000})")


def owned(worker: Any, table: str) -> list[int]:
    status, body, _ = get(f"{base(worker)}/weir/?format=json")
    assert status == 200, body
    return next(entry["partitions"] for entry in body["tables"] if entry["name"] == table)


@pytest.fixture(scope="module")
def deployment(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """Two aggregator workers of one group, splitting the partitions, with open and completed groups and a dead letter."""
    unique = uuid.uuid4().hex[:8]
    pipeline = Pipeline(bootstrap=kafka_bootstrap, tmp=tmp_path_factory.mktemp("web"), prefix=f"t{unique}.", app_id=f"t{unique}")
    try:
        asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in TOPICS], 4))
        first = pipeline.start_worker("aggregator", WEIR_AGGREGATE_TIMEOUT_MS=600_000)
        second = pipeline.start_worker("aggregator", WEIR_AGGREGATE_TIMEOUT_MS=600_000)
        first.wait_ready()
        second.wait_ready()
        wait_for(
            lambda: (
                sorted(owned(first, "aggregates") + owned(second, "aggregates")) == [0, 1, 2, 3]
                and owned(first, "aggregates")
                and owned(second, "aggregates")
            ),
            timeout_s=90,
            what="both workers own partitions of table aggregates",
        )
        deadline_ms = int(time.time() * 1000) + 600_000
        records: list[tuple[str, Any]] = []
        for group in [*OPEN_GROUPS, COMPLETED_GROUP]:
            records.append((group, {"kind": "open", "correlation_id": group, "total": 3, "deadline_ms": deadline_ms}))
            for index in (0, 2):
                records.append((group, {"kind": "item", "correlation_id": group, "index": index, "total": 3, "ok": True, "result": index}))
        records.append((COMPLETED_GROUP, {"kind": "item", "correlation_id": COMPLETED_GROUP, "index": 1, "total": 3, "ok": True}))
        item_results = pipeline.topic("item-results")
        asyncio.run(produce_json(pipeline.bootstrap, item_results, records))
        asyncio.run(produce(pipeline.bootstrap, item_results, [(XSS.encode(), POISON)]))

        def settled() -> bool:
            """Every open group listed and the completed one done (a count alone was met too early in a fresh-clone run:
            the completed group still open, and the last open one not in yet)."""
            listed = get(f"{base(first)}/weir/tables/aggregates/?format=json&size=100")[1]["keys"]
            done = get(f"{base(first)}/weir/tables/aggregates_done/?format=json")[1]["keys"]
            return sorted(row["key"] for row in listed) == sorted(OPEN_GROUPS) and [row["key"] for row in done] == [COMPLETED_GROUP]

        wait_for(settled, timeout_s=60, what="every open group is in table aggregates, and the completed one in aggregates_done")
        yield pipeline
    finally:
        pipeline.stop_all()


def test_index_lists_every_table_with_help_partitions_and_counts(deployment: Pipeline) -> None:
    first, second = deployment.workers
    bodies = [get(f"{base(worker)}/weir/")[1] for worker in (first, second)]
    names = {entry["name"] for entry in bodies[0]["tables"]}
    assert {"aggregates", "aggregates_done", "aggregate_deadlines"} <= names
    by_name = [{entry["name"]: entry for entry in body["tables"]} for body in bodies]
    assert "Open split groups" in by_name[0]["aggregates"]["help"]
    assert by_name[0]["aggregates"]["view"] == "open aggregations"
    assert sorted(by_name[0]["aggregates"]["partitions"] + by_name[1]["aggregates"]["partitions"]) == [0, 1, 2, 3]
    assert by_name[0]["aggregates"]["keys"] + by_name[1]["aggregates"]["keys"] == len(OPEN_GROUPS)
    assert bodies[0]["worker"] == base(first)
    assert bodies[0]["workers"] == sorted([base(first), base(second)])
    assert bodies[0]["group"] == f"{deployment.app_id}-aggregator"


def test_any_worker_lists_the_whole_table_paged_and_searched(deployment: Pipeline) -> None:
    first, second = deployment.workers
    for worker in (first, second):
        status, body, _ = get(f"{base(worker)}/weir/tables/aggregates/?size=4&page=1")
        assert status == 200, body
        assert body["total"] == len(OPEN_GROUPS)
        assert body["complete"] is True
        assert body["pages"] == 3
        assert {entry["url"] for entry in body["workers"]} == {base(first), base(second)}
        pages = [body["keys"]] + [get(f"{base(worker)}/weir/tables/aggregates/?size=4&page={page}")[1]["keys"] for page in (2, 3)]
        keys = [row["key"] for page in pages for row in page]
        assert keys == sorted(OPEN_GROUPS)
        assert {row["worker"] for page in pages for row in page} == {base(first), base(second)}
        summary = pages[0][0]["summary"]
        assert summary["received"] == 2
        assert summary["expected"] == 3
        assert summary["missing"] == [1]
        assert 500 < summary["due_in_s"] <= 600
    status, searched, _ = get(f"{base(first)}/weir/tables/aggregates/?q=SCRIPT")
    assert [row["key"] for row in searched["keys"]] == [XSS]
    assert searched["total"] == 1
    done = get(f"{base(second)}/weir/tables/aggregates_done/")[1]
    assert [row["key"] for row in done["keys"]] == [COMPLETED_GROUP]
    assert done["keys"][0]["summary"]["status"] == "complete"
    assert done["groups"] == {"complete": 1}  # counted by the registered group_by, over the whole table


def test_a_key_owned_by_another_worker_is_fetched_from_it(deployment: Pipeline) -> None:
    first, second = deployment.workers
    owners = {row["key"]: row["worker"] for row in get(f"{base(first)}/weir/tables/aggregates/?size=100")[1]["keys"]}
    assert set(owners.values()) == {base(first), base(second)}
    for key, owner in owners.items():
        for worker in (first, second):
            status, body, _ = get(f"{base(worker)}/weir/tables/aggregates/{quote(key, safe='')}/")
            assert status == 200, body
            assert body["key"] == key
            assert body["worker"] == owner
            assert body["served_by"] == base(worker)
            assert body["value"]["correlation_id"] == key
            assert [item["index"] for item in body["value"]["received"]] == [0, 2]
            assert body["summary"]["missing"] == [1]


def test_errors_are_structured_json_with_status_codes(deployment: Pipeline) -> None:
    url = base(deployment.workers[0])
    status, body, _ = get(f"{url}/weir/tables/nope/")
    assert (status, body) == (404, {"error": "no table 'nope' on this worker", "table": "nope", "key": None})
    status, body, _ = get(f"{url}/weir/no-such-view/")
    assert (status, body) == (404, {"error": "no view at /weir/no-such-view/: the index is /weir/", "table": None, "key": None})
    status, body, _ = get(f"{url}/weir/tables/aggregates/no-such-group/")
    assert (status, body) == (404, {"error": "key not found", "table": "aggregates", "key": "no-such-group"})
    status, body, _ = get(f"{url}/weir/tables/aggregates/?page=zero")
    assert status == 400
    assert body["table"] == "aggregates"
    assert "page='zero'" in body["error"]
    status, body, _ = get(f"{url}/weir/tables/aggregates/?size=100000")
    assert status == 400
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, body, headers = get(f"{url}/weir/tables/aggregates/g-1/", method=method)
        assert status == 405, (method, body)
        assert body["error"].startswith(f"method {method} not allowed")
        assert body["table"] == "aggregates"
        assert headers["Allow"] == "GET, HEAD"
    # the same data as HTML, chosen by Accept or ?format=
    status, text, headers = get(f"{url}/weir/tables/nope/", accept="text/html")
    assert status == 404
    assert headers["Content-Type"].startswith("text/html")
    assert "no table &#x27;nope&#x27; on this worker" in text
    status, body, _ = get(f"{url}/weir/tables/nope/?format=json", accept="text/html")
    assert status == 404
    assert body["table"] == "nope"


def test_dead_letters_are_read_from_the_topic_decoded(deployment: Pipeline) -> None:
    url = base(deployment.workers[1])
    body = wait_for(
        lambda: (answer := get(f"{url}/weir/dead-letters/?limit=100")[1])["dead_letters"] and answer,
        timeout_s=30,
        what="the poison message is in the dead letters",
    )
    assert body["topic"] == deployment.topic("dead-letters")
    [entry] = [entry for entry in body["dead_letters"] if entry["reason"] != "paging-test"]
    assert entry["reason"] == "undecodable"
    assert entry["agent"] == "aggregator"
    assert entry["step"] == "decode"
    assert entry["key"] == XSS
    assert entry["value_decoded"] == POISON.decode()
    assert entry["origin"]["topic"] == deployment.topic("item-results")
    assert "not valid JSON" in entry["error"]


PAGED_LETTERS = 30
#: Dead letters of records that once ended their whole page in HTTP 500 (JSON, HTML and HEAD), so no page past it could
#: be read: a lone surrogate, valid JSON text that no UTF-8 carries, in the key and the value; a value nested 300 deep.
HOSTILE_LETTERS: dict[int, dict[str, Any]] = {
    4: {"key": {"text": "s-\udc80"}, "value": {"text": '{"order_id": "s-\\udc80"}'}},
    11: {"value": {"text": "[" * 300 + "]" * 300}},
}


async def write_dead_letters(bootstrap: str, topic: str, count: int, *, first_failed_ms: int) -> None:
    """``count`` dead letters committed in transactions of 7 (markers between them), and one aborted transaction."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"web-test-{uuid.uuid4().hex[:8]}", linger_ms=0)
    await producer.start()
    try:
        for batch_start in range(0, count, 7):
            async with producer.transaction():
                for number in range(batch_start, min(batch_start + 7, count)):
                    record = {"reason": "paging-test", "error": f"letter {number}", "failed_ms": first_failed_ms + number}
                    record.update(HOSTILE_LETTERS.get(number, {}))
                    await producer.send(topic, json.dumps(record).encode(), key=f"letter-{number}".encode())
        await producer.begin_transaction()
        await producer.send_and_wait(topic, json.dumps({"reason": "aborted", "failed_ms": first_failed_ms}).encode(), key=b"aborted")
        await producer.abort_transaction()
    finally:
        await producer.stop()


def test_dead_letters_page_newest_first_through_one_reader(deployment: Pipeline) -> None:
    url = base(deployment.workers[0])
    first_failed_ms = int(time.time() * 1000) + 60_000  # after the poison message's
    asyncio.run(write_dead_letters(deployment.bootstrap, deployment.topic("dead-letters"), PAGED_LETTERS, first_failed_ms=first_failed_ms))
    wait_for(
        lambda: (
            [entry["error"] for entry in get(f"{url}/weir/dead-letters/?limit=1")[1]["dead_letters"]] == [f"letter {PAGED_LETTERS - 1}"]
        ),
        timeout_s=30,
        what="the newest dead letter written is on the first page",
    )
    pages: list[dict[str, Any]] = []
    page_urls: list[str] = []
    before = ""
    while True:
        page_url = f"{url}/weir/dead-letters/?limit=7" + (f"&before={before}" if before else "")
        page_urls.append(page_url)
        status, body, _ = get(page_url)
        assert status == 200, body
        assert body["before"] == (before or None)
        pages.append(body)
        if body["next"] is None:
            break
        before = body["next"]
        assert len(pages) < 20, "the pages do not end"
    entries = [entry for page in pages for entry in page["dead_letters"]]
    places = [(entry["partition"], entry["offset"]) for entry in entries]
    assert len(places) == len(set(places)), "a record on two pages"
    assert all(len(page["dead_letters"]) <= 7 for page in pages)
    # newest first across partitions, every committed letter once, the aborted one never, the poison message last
    assert [entry["error"] for entry in entries[:PAGED_LETTERS]] == [f"letter {number}" for number in reversed(range(PAGED_LETTERS))]
    assert [entry["reason"] for entry in entries[PAGED_LETTERS:]] == ["undecodable"]
    hostile = {int(entry["error"].split()[-1]): entry for entry in entries if entry["error"] in {"letter 4", "letter 11"}}
    assert (hostile[4]["key"], hostile[4]["value_decoded"]) == ("s-\\udc80", {"order_id": "s-\\udc80"})  # the escape, as text
    assert isinstance(hostile[11]["value_decoded"], list)  # shown to MAX_VIEW_DEPTH, deeper as its JSON text
    # one consumer for every page: started once (by this or an earlier request), one read per request
    readers = [page["reader"] for page in pages]
    assert {reader["consumers_started"] for reader in readers} == {1}
    reads = [reader["pages_read"] for reader in readers]
    assert reads == list(range(reads[0], reads[0] + len(pages)))
    # every page, the hostile letters' pages too, in every form
    for page_url in page_urls:
        for accept, method in (("text/html", "GET"), ("text/html", "HEAD"), ("application/json", "HEAD")):
            assert get(page_url, accept=accept, method=method)[0] == 200, f"{method} {accept} {page_url}"
    # a page asked for again is the same page: the cursor is offsets, not a position in a moving list
    again = get(f"{url}/weir/dead-letters/?limit=7&before={pages[1]['before']}")[1]
    assert again["dead_letters"] == pages[1]["dead_letters"]
    status, body, _ = get(f"{url}/weir/dead-letters/?before=9:1")
    assert status == 400
    assert "before='9:1'" in body["error"]


def test_faust_table_routes_point_to_the_weir_views(deployment: Pipeline) -> None:
    for worker in deployment.workers:
        url = base(worker)
        for key in OPEN_GROUPS:
            status, body, _ = get(f"{url}/table/aggregates/{quote(key, safe='')}/")
            see = f"/weir/tables/aggregates/{quote(key, safe='')}/"
            assert status == 404, body
            assert (body["table"], body["key"], body["see"]) == ("aggregates", key, see)
            assert body["error"].startswith("Faust's /table/ views are off on weir workers")
            status, found, _ = get(url + body["see"])
            assert status == 200, found
            assert found["key"] == key
        assert get(f"{url}/table/aggregates/")[1]["see"] == "/weir/tables/aggregates/"
        assert get(f"{url}/table/")[1]["see"] == "/weir/"


def test_faust_router_routes_point_to_the_weir_view_that_names_the_owner(deployment: Pipeline) -> None:
    first, second = deployment.workers
    owner_of_partition = {partition: base(worker) for worker in (first, second) for partition in owned(worker, "aggregates")}
    owners = set()
    for key in OPEN_GROUPS:
        owner = owner_of_partition[weir_partition(key, 4)]  # the worker whose partition holds the key, by weir's partitioner
        owners.add(owner)
        for worker in (first, second):
            status, body, _ = get(f"{base(worker)}/router/aggregates/{quote(key, safe='')}/")
            see = f"/weir/tables/aggregates/{quote(key, safe='')}/"
            assert status == 404, body
            assert (body["table"], body["key"], body["see"]) == ("aggregates", key, see)
            assert body["error"].startswith("Faust's /router/ views are off on weir workers")
            status, found, _ = get(base(worker) + body["see"])
            assert status == 200, found
            assert (found["key"], found["worker"]) == (key, owner), "weir's view names the worker that owns the key"
    assert owners == {base(first), base(second)}, "the keys are spread over both workers"
    for worker in (first, second):
        assert get(f"{base(worker)}/router/aggregates/")[1]["see"] == "/weir/tables/aggregates/"
        assert get(f"{base(worker)}/router/")[1]["see"] == "/weir/"
        assert get(f"{base(worker)}/router/topics")[1]["see"] == "/weir/"


# ------------------------------------------------------------------------------------------ Chromium


@pytest.fixture(scope="module")
def chromium() -> str:
    found = subprocess.run([str(ROOT / "scripts" / "chromium.sh")], capture_output=True, text=True, check=False, timeout=900)
    if found.returncode == 2 and os.geteuid() != 0:
        pytest.skip(f"no chromium and not root, so scripts/chromium.sh cannot install it: {found.stderr.strip()}")
    assert found.returncode == 0, f"scripts/chromium.sh failed:\n{found.stdout}\n{found.stderr}"
    return found.stdout.strip().splitlines()[-1]


def chromium_run(chromium: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        chromium,
        "--headless",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={tmp / 'chromium-profile'}",
        *args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, f"{command}: {result.returncode}\n{result.stderr[-3000:]}"
    return result


def dump_dom(chromium: str, tmp: Path, url: str) -> str:
    # --virtual-time-budget lets the page's own script run (the countdown) before the DOM is dumped
    return chromium_run(chromium, tmp, "--virtual-time-budget=2000", "--dump-dom", url).stdout


def test_a_person_sees_tables_counts_countdowns_and_escaped_keys_in_chromium(deployment: Pipeline, chromium: str, tmp_path: Path) -> None:
    first, second = deployment.workers
    index = dump_dom(chromium, tmp_path, f"{base(first)}/weir/")
    for name in ("aggregates", "aggregates_done", "aggregate_deadlines"):
        assert f'href="/weir/tables/{name}/">{name}</a>' in index
    assert "open aggregations" in index
    assert "Open split groups by correlation id" in index
    assert base(second) in index

    listing = dump_dom(chromium, tmp_path, f"{base(second)}/weir/tables/aggregates/")
    assert f"{len(OPEN_GROUPS)} keys on 2 worker(s)" in listing
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in listing  # the key shows as text...
    assert XSS not in listing  # ...and never as an element
    assert "due in " in listing
    assert listing.count('data-deadline-ms="') == len(OPEN_GROUPS)
    for group in OPEN_GROUPS[:-1]:
        assert f">{group}</a>" in listing

    key_page = dump_dom(chromium, tmp_path, f"{base(first)}/weir/tables/aggregates/{quote(XSS, safe='')}/")
    assert "<h1>&lt;script&gt;alert(1)&lt;/script&gt;</h1>" in key_page
    assert XSS not in key_page
    assert "missing</dt><dd>1</dd>" in key_page

    dead = dump_dom(chromium, tmp_path, f"{base(first)}/weir/dead-letters/")
    assert "undecodable" in dead
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in dead
    assert "<script>alert(2)" not in dead
    # only the page's own countdown script is a script element
    assert key_page.count("<script") == listing.count("<script") == dead.count("<script") == 1

    shot = tmp_path / "web-index.png"
    chromium_run(
        chromium, tmp_path, "--window-size=1280,720", "--hide-scrollbars", f"--screenshot={shot}", f"{base(first)}/weir/tables/aggregates/"
    )
    assert shot.stat().st_size > 10_000
    readme_image = ROOT / "docs" / "web-index.png"
    if os.environ.get("WEIR_UPDATE_SCREENSHOT") == "1" or not readme_image.exists():
        readme_image.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, readme_image)
