"""collect.executor=ray without a shared filesystem, or without Ray: a task dir reaches a node as
an archive, a node that cannot see a local run dir refuses naming the fix, and a machine without
Ray refuses the round before anything starts (the live cluster: tests/test_collect_ray.py)."""
from __future__ import annotations

import pytest


def test_without_ray_installed_the_round_is_refused_before_anything_starts(tmp_path, monkeypatch):
    import builtins

    from wharf.collect import runner
    from wharf.collect.ray_executor import RayExecutorError
    from wharf.core.config import load_config

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    cfg = load_config(None, [f"runs_dir={tmp_path}", "name=t", "collect.executor=ray",
                             "endpoint.url=http://127.0.0.1:9", "endpoint.launch=false"])
    with pytest.raises(RayExecutorError, match=r"pip install -e '\.\[ray\]'"):
        runner.run(cfg, progress=False)
    assert not (tmp_path / "t").exists()  # nothing written, no endpoint tried


def test_a_task_dir_travels_to_a_node_as_an_archive_unpacked_once(tmp_path):
    """No shared filesystem: a node runs the task from its own copy, files and modes as packed."""
    from wharf.collect.ship import ShipError, TaskCache, pack

    task = tmp_path / "datasets" / "sed-add"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text("[verifier]\n")
    (task / "tests" / "test.sh").write_text("#!/bin/sh\nexit 0\n")
    (task / "tests" / "test.sh").chmod(0o755)
    digest, data = pack(task)
    assert pack(task)[0] == digest  # the same dir, the same archive: fetched once per node
    cache = TaskCache(tmp_path / "node")
    here = cache.dir(digest, "sed-add", data)
    assert here != task and (here / "task.toml").read_text() == "[verifier]\n"
    assert (here / "tests" / "test.sh").stat().st_mode & 0o111  # still executable
    assert cache.has(digest) and cache.dir(digest, "sed-add") == here  # unpacked once
    with pytest.raises(ShipError, match="did not arrive whole"):
        TaskCache(tmp_path / "other").dir(digest, "sed-add", data[:-1])


def test_a_node_that_does_not_see_a_local_run_dir_refuses_naming_the_fix(tmp_path):
    """No shared filesystem and a local runs_dir: the node's actor fails to start (so the round
    leaves it out, naming why) instead of writing shards the driver never sees."""
    pytest.importorskip("ray")
    from wharf.collect.ray_executor import NodeActor, RayExecutorError
    from wharf.core.config import load_config

    cfg = load_config(None, [f"runs_dir={tmp_path / 'driver-only'}", "name=t", "endpoint.url=http://127.0.0.1:9"])
    with pytest.raises(RayExecutorError, match=r"does not see the run dir .*runs_dir=s3://"):
        NodeActor(cfg, "p", "node-a", str(tmp_path / "not-here"))


def test_a_hung_node_is_bounded_by_default_from_the_agents_timeout(tmp_path):
    """collect.ray_trial_timeout_s unset (was: no bound, so a hung node hung the round): the
    agent's timeout plus the verifier's plus 600 s, from the config or else the tasks' own."""
    from wharf.collect.ray_executor import TRIAL_SLACK_S, trial_timeout_s
    from wharf.core.config_stages import CollectConfig

    tasks = []
    for name, agent in (("a", 600.0), ("b", 900.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "task.toml").write_text(f"[agent]\ntimeout_sec = {agent}\n[verifier]\ntimeout_sec = 120.0\n")
        tasks.append(tmp_path / name)
    assert trial_timeout_s(CollectConfig(), tasks) == 900 + 120 + TRIAL_SLACK_S  # the longest task's
    assert trial_timeout_s(CollectConfig(agent_timeout_s=60, verifier_timeout_s=30), tasks) == 90 + TRIAL_SLACK_S
    assert trial_timeout_s(CollectConfig(), [tmp_path / "none"]) == 3600 + 600 + TRIAL_SLACK_S  # no task says
    assert trial_timeout_s(CollectConfig(ray_trial_timeout_s=20), tasks) == 20
