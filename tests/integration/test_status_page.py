"""The status page in a real browser: Debian's chromium driven through chromedriver by selenium,
on a follower of a 3-node cluster with a client token. The page asks for the token, then shows the
roles and a queue's count, and the count changes after a produce. And the page of a node started
with no config file, at the address it prints. Skipped, saying why, when chromium, chromedriver or selenium is missing
(.ci/install-tools installs the browser and its driver).

QUEUE_SERVER_SCREENSHOT=1 also writes the screenshot to docs/status-page.png (the README shows it).
"""
from __future__ import annotations

import os
import shutil
import threading

import pytest

from load.procs import stop_tree
from queue_server.client import QueueClient
from tests.harness import REPO, Cluster, free_port, printed_page, start_without_config, wait_for

TOKEN = "page-token"
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
CHROMEDRIVER = shutil.which("chromedriver")
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
except ImportError:  # pragma: no cover - the test extra has it
    webdriver = None

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None or webdriver is None,
    reason="needs chromium, chromedriver (.ci/install-tools installs both) "
           "and selenium (the test extra)")


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1000,900", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def text(driver, selector: str, attribute: str = "textContent") -> str | None:
    """The element's text (or another property) read in one step inside the page: the page
    re-renders its tables every refresh, so an element found first and read after can be gone
    (selenium's StaleElementReferenceException)."""
    value = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e[arguments[1]] : null;",
        selector, attribute)
    return value.strip() if isinstance(value, str) else value


def leader_of(cluster: Cluster) -> int | None:
    """The leader every node names, once it says it leads (asked with the token)."""
    views, roles = set(), {}
    for node_id, node in cluster.nodes.items():
        try:
            with QueueClient(node.hosts, token=TOKEN, timeout=1.0) as q:
                views.add(q.leader()["leader_node_id"])
                roles[node_id] = q.monitor(local=True).get("role")
        except Exception:
            return None
    leader = views.pop() if len(views) == 1 else None
    return leader if leader and roles.get(leader) == "leader" else None


def test_the_status_page_of_a_follower_shows_roles_and_a_queue_count_that_changes(tmp_path, browser):
    (tmp_path / "token").write_text(TOKEN)
    cluster = Cluster(str(tmp_path / "cluster"), 3, http=True, workers=1,
                      auth_token_file=str(tmp_path / "token")).start()
    try:
        leader = wait_for(lambda: leader_of(cluster), 20, "the nodes to agree on a leader")
        follower = next(i for i in cluster.nodes if i != leader)
        with QueueClient(cluster.hosts, token=TOKEN) as q:
            q.produce_batch("orders", ["o1", "o2", "o3"])
            q.produce("emails", "later", delay=600)
        browser.get(f"http://127.0.0.1:{cluster.nodes[follower].config['http_port']}/?refresh=1")
        # The API wants the token: the page asks for it, and keeps it.
        wait_for(lambda: browser.find_element(By.ID, "auth").is_displayed(), 20, "the page to ask for the token")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.CSS_SELECTOR, "#auth button").click()

        def roles() -> dict | None:
            rows = {i: text(browser, f'#nodes tr[data-node-id="{i}"] td.role') for i in cluster.nodes}
            return rows if all(rows.values()) else None
        shown = wait_for(roles, 20, "the page to show the nodes")
        assert shown == {i: "leader" if i == leader else "follower" for i in cluster.nodes}
        assert text(browser, f'#nodes tr[data-node-id="{follower}"]', "className") == "self"
        # what the answering node holds (overflow on, by default): known of itself only
        assert text(browser, f'#nodes tr[data-node-id="{follower}"] td.memory').endswith(" MiB")
        assert text(browser, f'#nodes tr[data-node-id="{follower}"] td.on-disk') == "0.0 MiB"
        assert text(browser, f'#nodes tr[data-node-id="{leader}"] td.memory') == "-"
        assert text(browser, "#groups-section", "hidden") is True  # one queue group: no table of groups
        wait_for(lambda: text(browser, '#queues tr[data-queue="orders"] td.ready') == "3", 20, "orders to show 3 ready")
        assert text(browser, '#queues tr[data-queue="emails"] td.delayed') == "1"

        # Produce (and consume some) for a few seconds, bounded, so that the page shows the change
        # and the rates.
        stop = threading.Event()

        def produce() -> None:
            with QueueClient(cluster.hosts, token=TOKEN) as q:
                for n in range(40):
                    if stop.is_set():
                        return
                    q.produce_batch("orders", [f"more {n}.{i}" for i in range(5)])
                    q.consume_batch("orders", 2)
                    stop.wait(0.1)  # paced, so that the page sees rates over a few refreshes
        producer = threading.Thread(target=produce)
        producer.start()
        try:
            wait_for(lambda: int(text(browser, '#queues tr[data-queue="orders"] td.ready') or 0) > 3, 20,
                     "the page to show the new messages")
            wait_for(lambda: float(text(browser, '#queues tr[data-queue="orders"] td.produced-rate') or 0) > 0, 20,
                     "a produce rate")
            producer.join(30)
        finally:
            stop.set()  # a failure above: the producer stops at once
            producer.join(30)
        wait_for(lambda: text(browser, '#queues tr[data-queue="orders"] td.ready') == "123", 20,
                 "the final count")
        shot = tmp_path / "status-page.png"
        browser.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if os.environ.get("QUEUE_SERVER_SCREENSHOT"):
            shutil.copy(shot, os.path.join(REPO, "docs", "status-page.png"))
    finally:
        cluster.stop()


def test_with_queue_groups_the_page_shows_each_group_s_leader_and_this_node_s_role(tmp_path, browser):
    cluster = Cluster(str(tmp_path / "cluster"), 3, http=True, workers=1, queue_groups=3).start()
    try:
        def spread() -> bool:  # each group led by its preferred leader, node g + 1
            reply = cluster.ask(2, {"action": 8})
            return bool(reply) and [row["leader_node_id"] for row in reply.get("groups", [])] == [1, 2, 3]
        wait_for(spread, 40, "each node to lead its own group")
        browser.get(f"http://127.0.0.1:{cluster.nodes[2].config['http_port']}/?refresh=1")

        def groups() -> list | None:
            rows = [(text(browser, f'#groups tr[data-group="{g}"] td.leader'),
                     text(browser, f'#groups tr[data-group="{g}"] td.role')) for g in range(3)]
            return rows if all(leader for leader, _ in rows) else None
        assert wait_for(groups, 20, "the page to show the groups") == [
            ("1", "follower"), ("2", "leader"), ("3", "follower")]
        assert text(browser, "#groups-section", "hidden") is False
        assert text(browser, '#groups tr[data-group="2"] td.replicas') == "3, 1, 2"
    finally:
        cluster.stop()


def test_the_page_of_a_node_started_with_no_config_is_where_it_says(tmp_path, browser):
    """`queue-server` as a newcomer runs it, but for its two ports (taken at run time through
    --port and --http-port, as in tests/integration/test_default_node.py): the address it prints
    opens its page, which shows it leading and a queue once there is one."""
    port = free_port()
    proc = start_without_config(tmp_path, "--port", str(port), "--http-port", str(free_port()))
    try:
        browser.get(printed_page(proc, tmp_path))
        wait_for(lambda: text(browser, '#nodes tr[data-node-id="1"] td.role') == "leader", 20,
                 "the page to show the node leading")
        with QueueClient(f"127.0.0.1:{port}") as q:
            q.produce("hello", "world")
        wait_for(lambda: text(browser, '#queues tr[data-queue="hello"] td.ready') == "1", 20,
                 "the page to show the queue")
    finally:
        stop_tree(proc, 15)
