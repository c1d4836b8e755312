"""`ingest dev` as a real process tree (webserver, daemon, code servers): SIGTERM or Ctrl-C (SIGINT)
stops all of it, and no process of it is left, re-parented to pid 1 or otherwise."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ingestion_assets.cli.supervise import tree
from ingestion_assets_tests.helpers import REPO, StreamHarness


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _alive(member: tuple[int, int]) -> bool:
    pid, started = member
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return int(fields[19]) == started and fields[0] != "Z"


@pytest.mark.parametrize(
    "signum",
    [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],  # one dagster dev start: ~45 s
    ids=["sigterm", "sigint"],
)
def test_ingest_dev_stops_its_whole_process_tree(harness: StreamHarness, signum: signal.Signals) -> None:
    harness.source.execute("CREATE TABLE items (id int PRIMARY KEY, updated_at timestamptz NOT NULL)")
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "updated_at"}})
    port = _free_port()
    ingest = Path(sys.executable).parent / "ingest"
    log = (harness.tmp_path / "dev.log").open("wb")
    process = subprocess.Popen(
        [str(ingest), "dev", "--", "--host", "127.0.0.1", "--port", str(port)],
        env=harness.cli_env(),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    members: set[tuple[int, int]] = set()
    try:
        deadline = time.monotonic() + 180
        while not _answers(f"http://127.0.0.1:{port}/server_info"):
            assert process.poll() is None, (harness.tmp_path / "dev.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the webserver did not come up"
            time.sleep(1)
        time.sleep(3)  # the daemon and the code servers start beside the webserver
        members = tree(process.pid)
        assert len(members) >= 4, members  # ingest, dagster dev, webserver, daemon (and code servers)
        process.send_signal(signum)
        assert process.wait(timeout=45) != 0
        time.sleep(0.5)
        survivors = [pid for pid, started in members if _alive((pid, started))]
        assert not survivors, f"still running after ingest dev stopped: {survivors}"
        assert not _answers(f"http://127.0.0.1:{port}/server_info")
        # started from the repository root, beside the deployment's dagster.yaml: no warning about it
        assert "in the current folder" not in (harness.tmp_path / "dev.log").read_text()
    finally:
        if process.poll() is None:
            process.kill()
        for pid, started in members:  # only what this test started
            if _alive((pid, started)):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "given",
    [["-p", "3127"], ["--", "-p", "3127"], ["--port", "3127", "-h", "0.0.0.0"], []],
)
def test_every_argument_after_dev_goes_to_dagster_dev(
    given: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`ingest dev -p 3127` failed with "unrecognized arguments: -p" (attack27): only `-- -p` passed it on."""
    from ingestion_assets.cli import main, stack

    passed: list[list[str]] = []
    monkeypatch.setenv("INGEST_HOME", str(tmp_path))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setattr(stack, "dev", lambda settings, args: passed.append(args.dagster_args) or 0)
    assert main(["dev", *given]) == 0
    assert passed == [given]
