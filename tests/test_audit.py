"""The audit counts orphan turns: rows of rollouts that a killed round opened but never finished."""
from __future__ import annotations

import datetime as dt


from wharf.core import schema
from wharf.collect.audit import audit_round, orphan_turns, orphans
from wharf.core.layout import CollectPaths
from wharf.collect.proxy.background import BackgroundProxy
from wharf.collect.records import RolloutRow
from tests.test_proxy import close_rollout, make_cfg, open_rollout, post

MSG = [{"role": "user", "content": "hello"}]


def rollout_row(rid: str, n_turns: int) -> dict:
    now = dt.datetime.now(dt.timezone.utc)
    return RolloutRow(rid, "job", 0, "task", "job.task", 0, "base-model", 1.0, "{}", "ok", n_turns, 0, now, now,
                      f"harbor/{rid}", None).as_dict()


def test_orphans_is_a_count_per_unknown_rollout():
    assert orphans(["a", "b", "b", "c"], {"a"}) == {"b": 2, "c": 1}
    assert orphans([], set()) == {}


def test_turns_of_a_rollout_never_closed_are_orphans(tmp_path, stub):
    paths = CollectPaths(tmp_path / "collect")
    cfg = make_cfg(tmp_path, stub.url, f"proxy.out_dir={paths.turns}")
    with BackgroundProxy(cfg) as p:
        for rid in ("finished", "killed"):
            info = open_rollout(p, rid)
            for _ in range(2 if rid == "finished" else 3):
                post(f"{info['base_url']}/chat/completions",
                              json={"model": "m", "messages": MSG}).raise_for_status()
        close_rollout(p, "finished")
        # "killed" is never closed: its trial died with the round; stopping publishes its rows anyway
    # The runner writes a rollouts row only for a finished trial.
    schema.write_table(paths.rollouts, "rollouts", [rollout_row("finished", 2)])
    report = audit_round(paths.root)
    assert report.orphan_turns == {"killed": 3}
    assert report.ok and report.skipped == ["finished"]  # no agent log here; the orphans are no problem
    assert orphan_turns(paths) == {"killed": 3}
    schema.write_table(paths.rollouts, "rollouts", [rollout_row("finished", 2), rollout_row("killed", 3)])
    assert orphan_turns(paths) == {} and audit_round(paths.root).orphan_turns == {}
