"""One writer per run (wharf/core/lease.py) on a real S3 server (SeaweedFS): its conditional PUTs,
a second driver refused naming the holder, a stale driver's pushes refused after a take-over
(its process stops; the newer driver's object stays), a killed or expired holder taken at once,
and a local run dir held the same way."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import boto3
import pytest
from botocore.exceptions import ClientError

from conftest import REPO
from wharf.core import lease, storage
from wharf.core.lease import may_take
from wharf.core.lease_store import Holder, S3Store

# A driver in a process of its own: holds the run, then pushes data.txt ("A <n>") every 0.2 s.
HOLDER = """
import sys, time
from pathlib import Path
from wharf.core import lease, storage
root = storage.local_path(sys.argv[1])
with lease.held(root, "wharf loop"):
    print("held", flush=True)
    for n in range(600):
        root.mkdir(parents=True, exist_ok=True)
        (root / "data.txt").write_text(f"A {n}")
        storage.push_file(root / "data.txt")
        time.sleep(0.2)
"""


def _holder(run: str, log, mirror) -> subprocess.Popen:
    """The holder on another machine: a mirror of its own."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "WHARF_MIRROR": str(mirror)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, run], env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_seaweedfs_honours_conditional_puts(s3):
    bucket, _, prefix = s3.removeprefix("s3://").partition("/")
    c = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    etag = c.put_object(Bucket=bucket, Key=f"{prefix}/k", Body=b"1", IfNoneMatch="*")["ETag"]
    for cond in ({"IfNoneMatch": "*"}, {"IfMatch": '"0123456789abcdef0123456789abcdef"'}):
        with pytest.raises(ClientError) as e:
            c.put_object(Bucket=bucket, Key=f"{prefix}/k", Body=b"2", **cond)
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert c.put_object(Bucket=bucket, Key=f"{prefix}/k", Body=b"3", IfMatch=etag)["ETag"] != etag
    # the store answers None (another writer came first) to a create over a lease and a stale tag
    store = S3Store(f"{s3}/lease.json")
    me = Holder("t", 1, "h", 1, "wharf loop", 0.0, 1e10)
    tag = store.write(me, None)
    assert tag and store.write(me, None) is None and store.write(me, etag) is None
    assert store.read().holder == me


def test_a_second_driver_is_refused_then_takes_over_and_the_stale_one_stops(s3, tmp_path):
    run = f"{s3}/runs/r"
    root = storage.local_path(run)
    with open(tmp_path / "a.log", "w") as log:
        a = _holder(run, log, tmp_path / "a")
        with pytest.raises(lease.LeaseHeld) as refused:
            with lease.held(root, "wharf loop"):
                pass
        line = str(refused.value)
        assert "\n" not in line and f"pid {a.pid}" in line and socket.gethostname() in line
        assert "since" in line and "expiring" in line and "WHARF_TAKE_OVER=1" in line and "lease.json" in line

        with lease.held(root, "wharf loop", take_over=True) as b:  # B takes the run over
            assert b.holder.generation == 2
            root.mkdir(parents=True, exist_ok=True)
            (root / "data.txt").write_text("B wrote this")
            time.sleep(0.5)  # an upload of A's already under way lands first
            storage.push_file(root / "data.txt")
            assert a.wait(timeout=60) == 1  # A's next push is refused: it stops
            time.sleep(0.5)
            assert storage.get(f"{run}/data.txt") == b"B wrote this"  # nothing of A's came after
    err = (tmp_path / "a.log").read_text()
    assert "LeaseLost" in err and "was taken over" in err and "generation 2" in err


def test_a_killed_or_expired_holder_is_taken_at_once(s3, tmp_path, monkeypatch):
    run = f"{s3}/runs/k"
    root = storage.local_path(run)
    with open(tmp_path / "a.log", "w") as log:
        a = _holder(run, log, tmp_path / "a")
        a.kill()
        a.wait()
    with lease.held(root, "wharf loop") as b:  # its pid is gone on this host: no wait
        assert b.holder.generation == 2
    assert "lease.json" not in storage.listing(run)  # released at the end

    store = S3Store(f"{run}/lease.json")  # a holder on another host, expired a second ago
    store.write(Holder("x", 7, "elsewhere", 1, "wharf loop", time.time() - 60, time.time() - 1), None)
    with lease.held(root, "wharf train") as c:
        assert c.holder.generation == 8
    store.write(Holder("y", 9, "elsewhere", 1, "wharf loop", time.time(), time.time() + 600), None)
    with pytest.raises(lease.LeaseHeld, match="held by wharf loop on elsewhere"):
        with lease.held(root, "wharf train"):
            pass


def test_nested_stages_and_child_processes_share_the_drivers_lease(s3):
    root = storage.local_path(f"{s3}/runs/n")
    with lease.held(root, "wharf loop") as outer:
        with lease.held(root, "wharf collect") as inner:
            assert inner is outer
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        child = "import sys; from wharf.core import lease, storage\n" \
                "with lease.held(storage.local_path(sys.argv[1]), 'wharf collect') as l: print(type(l).__name__)"
        out = subprocess.run([sys.executable, "-c", child, f"{s3}/runs/n"], env=env, capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip() == "Joined", out.stderr
        outer.check()


def test_a_local_run_dir_is_held_too_and_left_as_it_was(tmp_path):
    root = tmp_path / "runs" / "r"
    with lease.held(root, "wharf loop") as held:
        assert (root / "lease.json").is_file()
        store = held.store
        other = Holder("o", 1, "elsewhere", 1, "wharf collect", time.time(), time.time() + 600)
        assert store.write(other, None) is None  # a create over a lease fails
    assert not root.exists()  # released: no lease, no lock file, no run dir the lease made
    store.write(other, None)
    with pytest.raises(lease.LeaseHeld, match=r"runs/r/lease.json: this run is held by wharf collect on elsewhere"):
        with lease.held(root, "wharf loop"):
            pass


def test_who_may_take_a_held_lease():
    now, live, dead = 1000.0, (lambda pid: True), (lambda pid: False)
    held = Holder("t", 3, "host-a", 4121, "wharf loop", now - 60, now + 60)
    assert not may_take(held, now, "host-a", False, live)  # a live driver here
    assert may_take(held, now, "host-a", False, dead)  # a driver of this host that is gone
    assert not may_take(held, now, "host-b", False, dead)  # another host's pid says nothing here
    assert may_take(held, now + 61, "host-b", False, live)  # expired
    assert may_take(held, now, "host-b", True, live)  # WHARF_TAKE_OVER=1
    assert may_take(None, now, "host-b", False, live)


def test_every_s3_client_takes_the_same_endpoint_from_the_aws_variables(monkeypatch):
    """The lease's client is the uploads' (one config: path addressing, checksums only where asked),
    and pyarrow's file system points at the same server: an endpoint without a scheme is https."""
    from wharf.core import objects, uploads

    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "s3.example.internal:8333")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    store = S3Store("s3://bucket/runs/r/lease.json")
    assert store._client() is uploads.s3_client()
    assert store._client().meta.endpoint_url == "https://s3.example.internal:8333"
    assert store._client().meta.region_name == "eu-west-1"
    fs = objects.s3_filesystem()
    assert (fs.region, objects.s3_endpoint()) == ("eu-west-1", "https://s3.example.internal:8333")
