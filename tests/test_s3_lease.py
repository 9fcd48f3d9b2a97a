"""Two drivers on one live `s3://` run (SeaweedFS; real harbor trials through the recording proxy,
the vLLM-format stub holding every model call so the first loop stays in round 0's collect): a
second `wharf loop` is refused with one line naming the holder; then another driver takes the run
over and writes, the stub lets the first loop's trials finish, and the first loop's next push is
refused: it stops with one line, and the bucket holds exactly what the new driver left."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest

from conftest import REPO
from test_s3_loop import _args, _loop_cmd
from testing.vllm_stub import StubServer
from wharf.core import lease, storage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _wait(ready, what: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the first loop exited ({proc.returncode}) before {what}"
        assert time.monotonic() < end, f"no {what} within {timeout} s"
        time.sleep(0.2)


def _bucket(run: str) -> dict[str, str | None]:
    return {rel: storage.head(f"{run}/{rel}").etag for rel in storage.listing(run)}


def _one_line(text: str, prog: str = "wharf loop:") -> str:
    lines = [line for line in text.splitlines() if line.startswith(prog)]
    assert len(lines) == 1, text[-3000:]
    return lines[0]


def test_a_second_loop_is_refused_and_a_loop_taken_over_writes_nothing_more(s3, tmp_path, monkeypatch):
    runs, run = f"{s3}/runs", f"{s3}/runs/two"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with StubServer(loras=True, hold=lambda body: True) as stub, open(tmp_path / "a.log", "w") as log:
        args = _args(runs, "two", stub.url)
        a = subprocess.Popen(_loop_cmd(args), env={**env, "WHARF_MIRROR": str(tmp_path / "a")}, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait(lambda: stub.stub.held > 0, "a model call held by the stub", a)  # A is in round 0's trials
            b = subprocess.run(_loop_cmd(args), env={**env, "WHARF_MIRROR": str(tmp_path / "b")},
                               capture_output=True, text=True, timeout=180)
            line = _one_line(b.stderr)
            assert b.returncode == 1, b.stderr[-2000:]
            assert f"{run}/lease.json: this run is held by wharf loop on {socket.gethostname()} (pid {a.pid})" in line
            assert "since" in line and "expiring" in line and "WHARF_TAKE_OVER=1" in line

            monkeypatch.setenv("WHARF_MIRROR", str(tmp_path / "c"))  # C: another machine takes the run over
            with lease.held(storage.local_path(run), "wharf loop", take_over=True):
                time.sleep(1)  # an upload of A's already under way lands first
                storage.put(f"{run}/rounds/0/collect/manifest.json", json.dumps({"job_id": "C"}).encode())
                left = _bucket(run)
                stub.stub.release()  # A's trials finish; its next push is refused
                assert a.wait(timeout=240) == 1
                assert _bucket(run) == left  # nothing of A's landed after the take-over
        finally:
            if a.poll() is None:
                os.killpg(a.pid, 9)
                a.wait()
    line = _one_line((tmp_path / "a.log").read_text())
    assert "lease.json: this driver's lease (generation 1) was taken over" in line and "generation 2" in line
