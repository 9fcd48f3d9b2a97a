"""The recording proxy's durability: the write-ahead log before the answer, folding at start-up,
refused and kept-aside files, shard conversion, crash-safe compaction, owner-only files."""
from __future__ import annotations

import json
import os
import shutil

import openai
import pytest
import requests

from wharf.collect.proxy.background import BackgroundProxy
from wharf.core.schema import read_dir

from proxy_util import ADMIN, close_rollout, make_cfg, open_rollout, post, proxy, rows, wal_lines  # proxy: the fixture


def test_wal_is_written_before_the_answer_and_folded_at_startup(tmp_path, stub):
    cfg = make_cfg(tmp_path, stub.url, "proxy.shard_rows=100000")
    p = BackgroundProxy(cfg).start()
    info = open_rollout(p, "w")
    for i in range(5):
        post(f"{info['base_url']}/chat/completions",
                      json={"model": "m", "messages": [{"role": "user", "content": str(i)}]}).raise_for_status()
        assert wal_lines(p) == i + 1  # durable by the time the answer arrived
    assert rows(p) == []  # not yet published
    # Simulate a crash: copy the WAL aside before the clean stop publishes it, then put it back.
    saved = tmp_path / "saved_wal"
    shutil.copytree(p.proxy.wal_dir, saved)
    p.stop()
    published = rows(p)
    assert len(published) == 5
    for f in saved.glob("seg-*.jsonl"):
        shutil.copy(f, p.proxy.wal_dir / f.name)
    # ... plus a row that never made it to a shard, and a torn last line from a killed writer.
    seg = p.proxy.wal_dir / sorted(saved.glob("seg-*.jsonl"))[0].name
    extra = dict(json.loads(seg.read_bytes().splitlines()[0]), request_id="only-in-wal", turn=5)
    with open(seg, "ab") as f:
        f.write(json.dumps(extra).encode() + b"\n" + b'{"rollout_id": "w", "tu')
    with BackgroundProxy(cfg) as p2:
        assert p2.proxy.recovery["recovered_rows"] == 1
        got = rows(p2, "w")
        assert sorted(r["request_id"] for r in got) == sorted([r["request_id"] for r in published] + ["only-in-wal"])
        assert list(p2.proxy.wal_dir.glob("seg-*.jsonl.bad")) == []
        # The rollout is still open after the restart, with its key, and turns continue after the last one.
        r = post(f"{p2.url}/v1/chat/completions", headers={"Authorization": f"Bearer {info['api_key']}"},
                          json={"model": "m", "messages": [{"role": "user", "content": "again"}]})
        assert r.status_code == 200 and r.headers["x-wharf-turn"] == "6"
        assert close_rollout(p2, "w") == {"rollout_id": "w", "n_turns": 7, "n_errors": 0, "published": True}
    assert len(rows(p2, "w")) == 7


def test_unreadable_wal_record_is_kept_aside(tmp_path, stub):
    cfg = make_cfg(tmp_path, stub.url)
    wal = tmp_path / "turns" / "_wal"
    wal.mkdir(parents=True)
    (wal / "seg-00000001.jsonl").write_bytes(b"garbage\n")
    with BackgroundProxy(cfg) as p:
        assert p.proxy.recovery["bad_segments"] == [str(wal / "seg-00000001.jsonl")]
    assert (wal / "seg-00000001.jsonl.bad").read_bytes() == b"garbage\n"


def test_foreign_file_in_out_dir_is_named(tmp_path, stub):
    out = tmp_path / "turns"
    out.mkdir()
    (out / "part-0.parquet").write_bytes(b"not parquet")
    from wharf.core.schema import SchemaError
    with pytest.raises(SchemaError, match="part-0.parquet"):
        BackgroundProxy(make_cfg(tmp_path, stub.url)).start()
    assert os.path.exists(out / "part-0.parquet")


def test_wal_write_failure_never_answers_unrecorded(proxy):
    info = open_rollout(proxy, "diskfull")
    url = f"{info['base_url']}/chat/completions"
    store = proxy.proxy.store
    good_fd = store.wal.fd
    store.wal.fd = os.open(os.devnull, os.O_RDONLY)  # every write now fails like a full/broken disk
    try:
        r = post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 503 and "could not record" in r.json()["error"]["message"]
        r = post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True})
        assert "could not record" in r.text and "data: [DONE]" not in r.text
        assert store.pending == []
    finally:
        os.close(store.wal.fd)
        store.wal.fd = good_fd
    assert "wharf_proxy_record_failures_total 2" in requests.get(f"{proxy.url}/metrics").text
    r = post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200
    assert close_rollout(proxy, "diskfull")["n_turns"] == 1


def test_fast_shard_table_equals_schema_conversion():
    import array

    from wharf.core import schema
    from wharf.collect.proxy.shards import turns_table
    base = {"rollout_id": "r", "api": "chat", "policy": "p", "request": "{}", "response": None, "sampling": "{}",
            "finish_reason": "stop", "status": "ok", "error": None}
    rows = [dict(base, turn=0, request_id="a", started_at=1700000000.123456, ended_at=1700000001.5,
                 prompt_token_ids=[1, 2, 3], completion_token_ids=[4], completion_logprobs=[-0.5]),
            dict(base, turn=1, request_id="b", started_at=1700000002.0, ended_at=None,
                 prompt_token_ids=array.array("i", [1, 2, 3, 4, 2**31 - 1]), completion_token_ids=array.array("i"),
                 completion_logprobs=array.array("f"), status="error", error="boom")]
    assert turns_table(rows).equals(schema.to_table("turns", [
        {k: list(v) if isinstance(v, array.array) else v for k, v in r.items()} for r in rows]))


def test_second_proxy_on_the_same_dir_is_refused(proxy, stub):
    cfg = make_cfg(proxy.proxy.out_dir.parent, stub.url)
    with pytest.raises(RuntimeError, match="in use by another proxy"):
        BackgroundProxy(cfg).start()


def test_restart_after_an_interrupted_compaction_counts_each_row_once(tmp_path, stub):
    from wharf.core import schema
    cfg = make_cfg(tmp_path, stub.url)
    with BackgroundProxy(cfg) as p:
        url = f"{open_rollout(p, 'twice')['base_url']}/chat/completions"
        for _ in range(2):
            assert post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}]}).ok
            p.call(p.proxy.store.flush())
        turns = p.proxy.out_dir
    # A compaction killed between writing its shard and deleting the two it replaces.
    parts = schema.shard_files(turns)
    assert len(parts) == 2
    schema.write_table(turns / "part-zz-compact.parquet", "turns", read_dir(turns, "turns"),
                       {"replaces": json.dumps([f.name for f in parts])})
    with BackgroundProxy(cfg) as p:
        state = requests.get(f"{p.admin_url}/admin/rollouts/twice", headers=ADMIN).json()
        assert (state["n_turns"], state["n_errors"]) == (2, 0)
        assert close_rollout(p, "twice")["n_turns"] == 2


def test_run_files_holding_keys_or_calls_are_the_owners_only(proxy):
    opened = open_rollout(proxy)
    client = openai.OpenAI(base_url=opened["base_url"], api_key=opened["api_key"])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    files = [proxy.proxy.wal_dir / "rollouts.jsonl", *proxy.proxy.wal_dir.glob("seg-*.jsonl")]
    assert len(files) >= 2
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o600, f
