"""wharf.api, the stages as Python functions: configs in every form they take, typed results, cheap
to import, and callable from inside a running event loop as in Jupyter (where the stages' own
asyncio.run would fail): real trajectories imported there, and the demo round (the embedded
default: engine, proxy, a sandboxed trial, the audit) run there, then converted."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from wharf import api
from wharf.core.config import RunConfig
from wharf.pipeline.results import ConvertResult, DemoResult, ImportResult
from conftest import free_port, needs_bwrap
from test_import import mini_run, trial

REPO = Path(__file__).resolve().parents[1]


def test_a_config_comes_from_an_object_a_dict_a_file_or_a_carried_name_with_overrides():
    assert api.config().collect.concurrency == RunConfig().collect.concurrency  # the built-in defaults
    carried = api.config("default", {"collect.tasks": ["write-hello"], "sampling.seed": None})
    assert carried.collect.concurrency == 8 and carried.collect.tasks == ["write-hello"] and carried.sampling.seed is None
    again = api.config(carried, ["collect.attempts=3"])  # an object: its values kept, overrides on top
    assert (again.collect.attempts, again.collect.tasks, again.collect.concurrency) == (3, ["write-hello"], 8)
    assert api.config({"collect": {"attempts": 5}}).collect.attempts == 5
    assert api.config(REPO / "configs/learn.yaml").name == "learn"
    with pytest.raises(api.ConfigError, match=r"config dict: unknown key 'collect.atempts'; did you mean 'attempts'"):
        api.config({"collect": {"atempts": 5}})
    with pytest.raises(api.ConfigError, match="overrides: a list of key=value strings or a dict"):
        api.config(None, "collect.attempts=2")


def test_importing_the_api_loads_no_stage():
    code = ("import sys, wharf.api; print(sorted(m for m in ('torch', 'transformers', 'harbor', 'pydantic', "
            "'wharf.collect', 'wharf.train') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_a_stage_runs_from_inside_a_running_event_loop_plain_or_awaited(tmp_path):
    trial(tmp_path / "job", "say-hi__a", mini_run("Say hi.", toolcall=True), 1.0)

    async def notebook_cell():
        plain = api.import_(tmp_path / "imp", [tmp_path / "job"])  # a plain call, as in a cell
        awaited = await api.aimport_(tmp_path / "imp2", tmp_path / "job", reward=0.5)
        return plain, awaited

    plain, awaited = asyncio.run(notebook_cell())
    assert plain == ImportResult(collect_dir=tmp_path / "imp", trajectories=1, turns=2, mean_reward=1.0)
    assert awaited == ImportResult(collect_dir=tmp_path / "imp2", trajectories=1, turns=2, mean_reward=1.0)
    assert (plain.collect_dir / "rollouts.parquet").is_file() and (awaited.collect_dir / "manifest.json").is_file()


def test_a_stage_error_reaches_the_caller_in_the_loop(tmp_path):
    async def cell():
        return api.import_(tmp_path / "out", [tmp_path / "missing"])

    with pytest.raises(api.WharfError, match="missing"):
        asyncio.run(cell())


@pytest.mark.slow
@needs_bwrap
def test_the_demo_round_runs_from_inside_a_running_event_loop(tmp_path):
    port = free_port()
    overrides = {"runs_dir": str(tmp_path), "collect.tasks": ["write-hello"], "collect.attempts": 1,
                 "engine.port": port, "endpoint.url": f"http://127.0.0.1:{port}", "proxy.port": free_port()}

    async def notebook_cell():
        return api.demo("default", overrides)  # engine, proxy and trial start their own loops in a worker thread

    async def then_convert():  # the awaited form: the loop stays free while it runs
        return await api.aconvert("default", {"runs_dir": str(tmp_path), "convert.length_completions": "keep"})

    result = asyncio.run(notebook_cell())
    assert isinstance(result, DemoResult) and result.ok, result.problems
    c = result.collect
    assert (c.planned, c.finished, c.statuses, result.audited) == (1, 1, {"ok": 1}, 1)
    assert c.collect_dir == tmp_path / "default/rounds/0/collect" and c.rollouts.is_file() and c.manifest.is_file()
    assert c.mean_reward in (0.0, 1.0)
    converted = asyncio.run(then_convert())
    assert isinstance(converted, ConvertResult) and converted.convert_dir == tmp_path / "default/rounds/0/convert"
    # one attempt is a group of one: read, and left out (no advantage without a second rollout)
    assert converted.rollouts_read == 1 and converted.rows == 0 and (converted.convert_dir / "stats.json").is_file()
