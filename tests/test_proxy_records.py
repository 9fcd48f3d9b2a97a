"""Honest records: calls the agent hung up on are `abandoned`, never `ok`; an answer leaves only
after its WAL record's fsync (group commit), and renames are made durable with a directory fsync."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
import urllib.parse

import pytest
import requests

from wharf.core.config import load_config
from wharf.collect.proxy import wal as wal_mod
from wharf.collect.proxy.background import BackgroundProxy
from wharf.collect.proxy.wal import SegmentLog, read_records
from tests.test_proxy import close_rollout, make_cfg, open_rollout, post, rows

MSG = [{"role": "user", "content": "fix the bug"}]


@pytest.fixture
def proxy(tmp_path, stub):
    with BackgroundProxy(make_cfg(tmp_path, stub.url)) as p:
        yield p


def hang_up(url: str, key: str, body: dict, wait_for: bytes | None = None, after: float = 0.3) -> bytes:
    """A real HTTP client that sends one call and closes its connection before the answer is whole:
    after `after` seconds, or as soon as `wait_for` has been read (a stream's first chunk)."""
    u = urllib.parse.urlsplit(url)
    data = json.dumps(body).encode()
    got = b""
    with socket.create_connection((u.hostname, u.port)) as s:
        s.sendall(f"POST {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                  f"Authorization: Bearer {key}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        if wait_for is None:
            time.sleep(after)
        else:
            s.settimeout(10)
            while wait_for not in got:
                got += s.recv(65536)
    return got


def test_default_is_fsync_on():
    assert load_config(None, []).proxy.wal_fsync is True


def test_full_call_dropped_before_its_slow_answer_is_abandoned_and_a_retry_is_ok(proxy):
    info = open_rollout(proxy, "drop-full")
    url = f"{info['base_url']}/chat/completions"
    hang_up(url, info["api_key"], {"model": "m", "messages": MSG, "stub_delay": 1.0}, after=0.3)
    r = post(url, json={"model": "m", "messages": MSG})  # the agent's retry
    assert r.status_code == 200
    assert close_rollout(proxy, "drop-full") == {"rollout_id": "drop-full", "n_turns": 2, "n_errors": 0, "published": True}
    got = sorted(rows(proxy, "drop-full"), key=lambda t: t["turn"])
    assert [t["status"] for t in got] == ["abandoned", "ok"]
    assert "closed its connection" in got[0]["error"]
    # The upstream did complete it: what it generated is kept for the record (convert skips it).
    assert got[0]["completion_token_ids"] and got[0]["request_id"] != r.headers["x-wharf-request-id"]
    assert 'wharf_proxy_abandoned_total{policy="base-model"} 1' in requests.get(f"{proxy.url}/metrics").text


def test_stream_dropped_before_it_starts_is_abandoned(proxy):
    info = open_rollout(proxy, "drop-early")
    hang_up(f"{info['base_url']}/chat/completions", info["api_key"],
            {"model": "m", "messages": MSG, "stream": True, "stub_delay": 1.0}, after=0.3)
    close_rollout(proxy, "drop-early")
    assert [t["status"] for t in rows(proxy, "drop-early")] == ["abandoned"]


def test_stream_dropped_midway_is_abandoned_not_an_upstream_error(proxy):
    info = open_rollout(proxy, "drop-mid")
    seen = hang_up(f"{info['base_url']}/chat/completions", info["api_key"],
                   {"model": "m", "messages": MSG, "stream": True, "stub_chunk_delay": 0.1}, wait_for=b"data: ")
    assert b"200 OK" in seen
    assert close_rollout(proxy, "drop-mid")["n_errors"] == 0
    (row,) = rows(proxy, "drop-mid")
    assert row["status"] == "abandoned" and "disconnected" in row["error"]
    metrics = requests.get(f"{proxy.url}/metrics").text
    assert 'wharf_proxy_abandoned_total{policy="base-model"} 1' in metrics and "wharf_proxy_errors_total" not in metrics


def test_group_commit_shares_one_fsync_among_calls_in_flight(tmp_path):
    async def go(fsync: bool):
        log = SegmentLog(tmp_path / str(fsync), fsync=fsync)
        log.open()
        seqs = [log.append(b'{"n": %d}\n' % i) for i in range(64)]
        await asyncio.gather(*(log.durable(s) for s in seqs))
        syncs = log.n_syncs
        await log.drain()
        log.close()
        return syncs, log.synced

    assert asyncio.run(go(True)) == (1, 64)  # 64 waiters, one fsync
    assert asyncio.run(go(False)) == (0, 0)
    assert len(read_records(tmp_path / "True" / "seg-00000001.jsonl")[0]) == 64


def test_rotation_while_an_fsync_runs_keeps_the_old_segment_open_until_synced(tmp_path, monkeypatch):
    gate, real = threading.Event(), wal_mod._sync_all
    monkeypatch.setattr(wal_mod, "_sync_all", lambda fds, d: (gate.wait(10), real(fds, d)))

    async def go():
        log = SegmentLog(tmp_path, fsync=True)
        log.open()
        first = asyncio.ensure_future(log.durable(log.append(b'{"n": 1}\n')))
        await asyncio.sleep(0.05)  # its batch is in the sync thread, held at the gate
        old_fd = log.fd
        assert log.rotate() == 1 and log.fd != old_fd
        second = asyncio.ensure_future(log.durable(log.append(b'{"n": 2}\n')))
        os.fstat(old_fd)  # still open: the thread may be syncing it
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        with pytest.raises(OSError):
            os.fstat(old_fd)  # closed once the batch after the rotation synced it
        assert log.synced == 2
        await log.drain()
        log.close()

    asyncio.run(go())
    assert [len(read_records(tmp_path / f"seg-0000000{i}.jsonl")[0]) for i in (1, 2)] == [1, 1]


def test_answer_waits_for_its_fsync(proxy, monkeypatch):
    gate, real = threading.Event(), wal_mod._sync_all
    monkeypatch.setattr(wal_mod, "_sync_all", lambda fds, d: (gate.wait(10), real(fds, d)))
    info = open_rollout(proxy, "slow-disk")
    box = {}
    t = threading.Thread(target=lambda: box.update(r=post(
        f"{info['base_url']}/chat/completions", json={"model": "m", "messages": MSG})))
    t.start()
    time.sleep(0.5)
    assert "r" not in box, "answered before the WAL record was fsynced"
    assert sum(len(read_records(f)[0]) for f in proxy.proxy.wal_dir.glob("seg-*.jsonl")) == 1  # written, not synced
    gate.set()
    t.join(10)
    assert box["r"].status_code == 200
    metrics = requests.get(f"{proxy.url}/metrics").text
    assert "wharf_proxy_wal_fsyncs_total 1" in metrics and "wharf_proxy_wal_fsynced_records_total 1" in metrics


def test_fsync_failure_answers_503_from_then_on(proxy, monkeypatch):
    def broken(fds, d):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(wal_mod, "_sync_all", broken)
    info = open_rollout(proxy, "eio")
    url = f"{info['base_url']}/chat/completions"
    for _ in range(2):  # the kernel may have dropped the pages: nothing after a failed fsync is acknowledged
        r = post(url, json={"model": "m", "messages": MSG})
        assert r.status_code == 503 and "WAL fsync failed" in r.json()["error"]["message"]


def test_shard_renames_and_new_segments_fsync_their_directory(tmp_path, stub, monkeypatch):
    import wharf.core.atomic as atomic_mod
    synced = []
    for mod in (atomic_mod, wal_mod):
        real = mod.fsync_dir
        monkeypatch.setattr(mod, "fsync_dir", lambda d, real=real: (synced.append(os.path.realpath(d)), real(d)))
    with BackgroundProxy(make_cfg(tmp_path, stub.url)) as p:
        info = open_rollout(p, "dirs")
        post(f"{info['base_url']}/chat/completions", json={"model": "m", "messages": MSG}).raise_for_status()
        assert os.path.realpath(p.proxy.wal_dir) in synced  # the segment's creation, before the answer
        close_rollout(p, "dirs")  # publishes a shard
        assert os.path.realpath(p.proxy.out_dir) in synced
