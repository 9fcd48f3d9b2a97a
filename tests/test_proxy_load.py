"""The proxy as its own process under load: accounting with injected errors, and SIGKILL mid-load."""
from __future__ import annotations

import collections
import signal
import threading
import time
import urllib.request

import pytest

from testing.proxy_load import (admin, admin_access, chat_body, free_port, load_stopper, recorded_calls, run_load,
                                start_proxy, start_stub, stop)
from wharf.core.schema import read_dir


def open_targets(base: str, access, n: int, stream_every: int = 0, prefix: str = "load"):
    targets, rollouts = [], []
    for i in range(n):
        r = admin(access, "POST", "/admin/rollouts", {"rollout_id": f"{prefix}-{i}"})
        rollouts.append(r)
        stream = bool(stream_every) and i % stream_every == stream_every - 1
        # Every client sends its rollout's key; half name their rollout by path too, half use plain /v1.
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {r['api_key']}"}
        url = f"{r['base_url']}/chat/completions" if i % 2 else f"{base}/v1/chat/completions"
        targets.append((url, headers, chat_body(2048, stream)))
    return targets, rollouts


def wait_until(ready, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


def check_turns(rows):
    """Per rollout: turns unique; request ids unique overall."""
    ids = [r["request_id"] for r in rows]
    assert len(ids) == len(set(ids)), "a row was written twice"
    per = collections.defaultdict(list)
    for r in rows:
        per[r["rollout_id"]].append(r["turn"])
    for rid, turns in per.items():
        assert len(turns) == len(set(turns)), f"{rid}: duplicate turn numbers"
    return per


@pytest.mark.slow
def test_5000_calls_64_clients_5pct_upstream_errors(tmp_path):
    stub_port, proxy_port = free_port(), free_port()
    stub = start_stub(stub_port, error_rate=0.05, completion_tokens=20)
    out = tmp_path / "turns"
    proxy = start_proxy(proxy_port, f"http://127.0.0.1:{stub_port}", out, extra=["proxy.shard_rows=700"],
                        log=open(tmp_path / "proxy.log", "wb"))
    base = f"http://127.0.0.1:{proxy_port}"
    try:
        access = admin_access(out)
        targets, rollouts = open_targets(base, access, 64, stream_every=4)
        results, wall = run_load(targets, 5000, procs=2)
        closed = [admin(access, "POST", f"/admin/rollouts/{r['rollout_id']}/close") for r in rollouts]
        with urllib.request.urlopen(f"http://127.0.0.1:{stub_port}/stub/stats") as resp:
            import json
            stub_stats = json.loads(resp.read())
        with urllib.request.urlopen(f"{base}/metrics") as resp:
            metrics = resp.read().decode()
    finally:
        assert stop(proxy) == 0, (tmp_path / "proxy.log").read_text()[-2000:]
        stop(stub)
    assert len(results) == 5000
    assert all(r[1] != -1 for r in results), "every call got an HTTP answer from the proxy"
    rows = read_dir(out, "turns").to_pylist()
    assert len(rows) == 5000, "one row per call: none lost, none duplicated"
    per = check_turns(rows)
    assert all(sorted(t) == list(range(len(t))) for t in per.values()), "turns are 0..n-1 without gaps"
    by_id = {r["request_id"]: r for r in rows}
    assert set(by_id) == {r[3] for r in results}, "the ids the clients saw are exactly the rows"
    for _, status, ok, request_id, *_ in results:
        row = by_id[request_id]
        assert (row["status"] == "ok") == ok, (status, row["error"])
        if ok:
            assert len(row["completion_token_ids"]) == len(row["completion_logprobs"]) > 0
            assert row["prompt_token_ids"]
        else:
            assert row["error"] and row["completion_token_ids"] == []
    n_err = sum(r["status"] == "error" for r in rows)
    injected = sum(v for k, v in stub_stats.items() if k.startswith("error:"))
    assert stub_stats["requests"] == 5000
    assert n_err == injected, "every injected upstream error is an error row, and nothing else is"
    assert 0.03 * 5000 < n_err < 0.07 * 5000
    assert sum(c["n_turns"] for c in closed) == 5000 and sum(c["n_errors"] for c in closed) == n_err
    assert f'wharf_proxy_calls_total{{policy="smollm2-135m",status="error"}} {n_err}' in metrics
    assert len(list(out.glob("part-*.parquet"))) >= 5, "shards were cut by rows during the run"
    assert not list((out / "_wal").glob("seg-*.jsonl")) or all(
        f.stat().st_size == 0 for f in (out / "_wal").glob("seg-*.jsonl")), "the WAL is retired after publishing"
    print(f"\n5000 calls, 64 clients: {5000 / wall:.0f} calls/s (shared CPUs), {n_err} injected errors recorded")


def check_every_answered_call_kept(results, rows, killed_at: float):
    """Load ran on both sides of a kill, and every call a client got an answer to is a row, once."""
    answered = [r[3] for r in results if r[2]]
    failed = [r for r in results if not r[2]]
    assert len(answered) > 50 and failed, "load ran on both sides of the kill"
    check_turns(rows)
    counts = collections.Counter(r["request_id"] for r in rows)
    missing = [i for i in answered if counts[i] != 1]
    assert not missing, f"{len(missing)} answered calls are not in the shards exactly once"
    assert all(r["status"] == "ok" for r in rows if r["request_id"] in set(answered))
    after = [r for r in rows if r["started_at"].timestamp() > killed_at]
    assert after, "the restarted proxy kept recording the same rollouts"
    return answered


@pytest.mark.slow
def test_sigkill_during_load_loses_no_answered_call(tmp_path):
    stub_port, proxy_port = free_port(), free_port()
    stub = start_stub(stub_port, completion_tokens=20)
    out = tmp_path / "turns"
    upstream = f"http://127.0.0.1:{stub_port}"
    # Small shards: some rows are published before the kill, some only in the WAL. fsync on (the
    # default, named here because it is what is tested): every answer waited for its group commit.
    extra = ["proxy.shard_rows=100", "proxy.wal_fsync=true"]
    log = open(tmp_path / "proxy.log", "ab")
    proxy = start_proxy(proxy_port, upstream, out, extra=extra, log=log)
    base = f"http://127.0.0.1:{proxy_port}"
    proxy2 = None
    # The kill and the end of the load wait for calls, not for the clock: on a loaded machine the
    # load's processes may take seconds to start, and the restarted proxy seconds to answer.
    stop_load = load_stopper()
    try:
        targets, rollouts = open_targets(base, admin_access(out), 32, stream_every=3, prefix="kill")
        box = {}
        load = threading.Thread(target=lambda: box.update(
            res=run_load(targets, 10**7, procs=2, seconds=180.0, stop=stop_load)))
        load.start()
        wait_until(lambda: recorded_calls(base) >= 150, 120, "the first proxy recording 150 calls (a shard and more)")
        proxy.send_signal(signal.SIGKILL)
        proxy.wait()
        killed_at = time.time()
        proxy2 = start_proxy(proxy_port, upstream, out, extra=extra, log=log)
        wait_until(lambda: recorded_calls(base) >= 50, 120, "the restarted proxy recording 50 calls")
        stop_load.set()
        load.join()
        # The restarted proxy has a token of its own; the rollouts and their keys are the same.
        access2 = admin_access(out)
        closed = [admin(access2, "POST", f"/admin/rollouts/{r['rollout_id']}/close") for r in rollouts]
    finally:
        stop_load.set()
        if proxy.poll() is None:
            proxy.kill()
        if proxy2 is not None:
            assert stop(proxy2) == 0
        stop(stub)
    results, _ = box["res"]
    rows = read_dir(out, "turns").to_pylist()
    answered = check_every_answered_call_kept(results, rows, killed_at)
    assert sum(c["n_turns"] for c in closed) == len(rows)
    text = (tmp_path / "proxy.log").read_text()
    assert "folded" in text and "left-over WAL" in text, text[-2000:]
    print(f"\nSIGKILL mid-load: {len(answered)} answered calls, all in the shards once; {len(rows)} rows in all")
