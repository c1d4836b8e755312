"""The operator's view in a real browser (Debian's chromium, driven by selenium): the Dagster webserver of a
test instance shows a stream's row count, columns and position, the source asset upstream of it, and a
materialization launched from the UI runs to success. Screenshots land in .ingest/test-artifacts/browser/."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ingestion_assets.cli.supervise import stop_tree
from ingestion_assets_tests.helpers import REPO, StreamHarness

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ARTIFACTS = REPO / ".ingest" / "test-artifacts" / "browser"
WAIT = 90.0  # seconds for a page element or a run on a loaded machine

ORDERS = """
CREATE TABLE orders (id bigint PRIMARY KEY, customer text, amount numeric(12,2), updated_at timestamptz NOT NULL);
INSERT INTO orders SELECT g, 'c' || g % 7, g * 1.5, now() - interval '1 day' + g * interval '1 s'
FROM generate_series(1, 1234) g;
"""


def _ensure_chromium() -> None:
    """Debian's chromium and its driver, installed with apt-get when missing (no browser download exists here)."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.skip("chromium is not installed and apt-get is not available to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([apt, "update"], check=True, capture_output=True, env=env)
    subprocess.run([apt, "install", "-y", "chromium", "chromium-driver"], check=True, capture_output=True, env=env)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(what: str, done: Callable[[], object], seconds: float = WAIT) -> object:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = done()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out after {seconds:.0f}s waiting for {what}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture
def synced(harness: StreamHarness) -> StreamHarness:
    """A small catalog, materialized once."""
    harness.source.execute(ORDERS)
    harness.write_catalog({"orders": {"table": "orders", "primary_key": "id", "cursor": "updated_at"}})
    harness.materialize()
    return harness


@pytest.fixture
def webserver(synced: StreamHarness) -> Iterator[str]:
    harness = synced
    """`dagster-webserver` on the test instance's storage. Its own DAGSTER_HOME without the run queue: a run
    launched from the UI starts at once, with no daemon to dequeue it."""
    config = yaml.safe_load((harness.settings.dagster_home / "dagster.yaml").read_text())
    config.get("concurrency", {}).pop("runs", None)
    config["run_coordinator"] = {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}
    home = harness.tmp_path / "ui_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    port = _free_port()
    command = [str(Path(sys.executable).parent / "dagster-webserver"), "-m", "ingestion_assets.definitions"]
    log = (harness.tmp_path / "webserver.log").open("wb")
    process = subprocess.Popen(
        [*command, "-h", "127.0.0.1", "-p", str(port)],
        env=harness.cli_env(DAGSTER_HOME=str(home)),
        cwd=harness.tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait("the webserver", lambda: process.poll() is not None or _answers(f"{base}/server_info"))
        assert process.poll() is None, (harness.tmp_path / "webserver.log").read_text()[-3000:]
        yield base
    finally:
        stop_tree(process.pid, grace=10)
        log.close()


@pytest.fixture
def browser() -> Iterator[object]:
    _ensure_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1400,1000")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_asset_page_lineage_and_a_launch_in_a_real_browser(
    synced: StreamHarness, webserver: str, browser: object
) -> None:
    from selenium.common.exceptions import (
        ElementClickInterceptedException,
        NoSuchElementException,
        StaleElementReferenceException,
    )
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    harness = synced
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"screenshots: {ARTIFACTS}")
    key = harness.key("orders")
    page = f"{webserver}/assets/{'/'.join(key.path)}"

    def text() -> str:
        return str(browser.find_element(By.TAG_NAME, "body").text)

    def skip_welcome() -> None:  # the first visit's "Join the Dagster community" dialog
        for button in browser.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
            button.click()

    browser.get(page)
    _wait("the asset page's row count and columns", lambda: "Row count" in text() and "Columns" in text())
    skip_welcome()
    body = text()
    browser.save_screenshot(str(ARTIFACTS / "asset_page.png"))
    assert "Row count\n1,234" in body  # the rows in the target, from dagster/row_count
    for column in ("id", "customer", "amount", "updated_at", "_ingest_position", "primary key (id)"):
        assert f"\n{column}\n" in body, column
    assert "\nposition\n" in body and "ingest/checkpoint" in body
    source = f"/assets/source/{harness.source_name}/{harness.source.schema}/orders"
    upstream = browser.find_elements(By.XPATH, f"//a[@href='{source}']")
    assert upstream, "the source table is not listed upstream"

    browser.get(f"{page}?view=lineage")
    _wait("the lineage graph", lambda: text().count("\norders\n") >= 2 + text().count("Assets\norders\n"))
    skip_welcome()
    browser.save_screenshot(str(ARTIFACTS / "lineage.png"))
    browser.get(f"{webserver}{source}")
    _wait("the source asset's page", lambda: "Downstream assets" in text() or "External" in text())
    browser.save_screenshot(str(ARTIFACTS / "source_asset.png"))
    assert f"{harness.source_name} / orders" in text()  # the stream, downstream of its source table

    before = {r.run_id for r in harness.instance.get_runs()}
    browser.get(page)
    materialize = "//button[.//*[text()='Materialize']]"
    _wait("the Materialize button", lambda: browser.find_elements(By.XPATH, materialize))
    skip_welcome()

    def launched_runs() -> list[dg.DagsterRun]:
        return [r for r in harness.instance.get_runs() if r.run_id not in before]

    def click_then_look() -> list[dg.DagsterRun]:
        """The page re-renders while its queries settle: a button found a moment ago may be gone (stale) or still
        disabled, so the click is repeated until a run exists, looking for one for a few seconds after each."""
        try:
            skip_welcome()
            browser.find_element(By.XPATH, materialize).click()
        except (StaleElementReferenceException, ElementClickInterceptedException, NoSuchElementException):
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not launched_runs():
            time.sleep(0.3)
        return launched_runs()

    launched = _wait("a run launched from the UI", click_then_look)
    assert isinstance(launched, list)
    run_id = launched[0].run_id
    browser.save_screenshot(str(ARTIFACTS / "launched.png"))
    finished = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
    try:
        _wait("the launched run", lambda: _status(harness, run_id) in finished, 180)
    except AssertionError as exc:
        events = [e.message for e in harness.instance.all_logs(run_id)][-15:]
        log = (harness.tmp_path / "webserver.log").read_text()[-3000:]
        raise AssertionError(f"run {run_id} is {_status(harness, run_id)}: {events}\n{log}") from exc
    browser.get(f"{webserver}/runs/{run_id}")
    _wait("the run page", lambda: "Success" in text() or "Failure" in text())
    browser.save_screenshot(str(ARTIFACTS / "launched_run.png"))
    assert _status(harness, run_id) == dg.DagsterRunStatus.SUCCESS


def _status(harness: StreamHarness, run_id: str) -> dg.DagsterRunStatus | None:
    run = harness.instance.get_run_by_id(run_id)
    return run.status if run is not None else None
