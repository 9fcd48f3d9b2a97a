"""wharf import on real trajectory files, made here by the real classes: mini-swe-agent's
DefaultAgent (its shipped configs, a scripted DeterministicModel, commands run by its
LocalEnvironment) writes its own trajectory, harbor's converter writes the ATIF trajectory.json of
it; laid out as a harbor trial with its result.json. The import holds exactly the conversation
the model was sent; convert.mode=sft turns it into rows; bad files are refused by file and field
with nothing written."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from wharf.collect.importers import import_trajectories
from wharf.collect.importers.formats import TrajectoryError
from wharf.core import schema
from wharf.core.layout import CollectPaths

DONE = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def mini_run(task: str, toolcall: bool) -> dict:
    """A real mini-swe-agent run (two calls: a command, then the submit) serialized as mini writes it."""
    import minisweagent
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models import test_models as tm

    cfg = yaml.safe_load((Path(minisweagent.__file__).parent / "config" /
                          ("mini.yaml" if toolcall else "mini_textbased.yaml")).read_text())
    if toolcall:
        def out(i, cmd):
            call = {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": cmd})}}
            return tm.make_toolcall_output(None, [call], [{"command": cmd, "tool_call_id": f"call_{i}"}])
        model = tm.DeterministicToolcallModel(outputs=[out(0, "echo hi"), out(1, DONE)],
                                              observation_template=cfg["model"]["observation_template"])
    else:
        outs = [tm.make_output(f"THOUGHT: {t}\n\n```mswea_bash_command\n{c}\n```", [{"command": c}])
                for t, c in (("look first", "echo hi"), ("submit", DONE))]
        model = tm.DeterministicModel(outputs=outs, observation_template=cfg["model"]["observation_template"])
    agent = DefaultAgent(model, LocalEnvironment(), **{**cfg["agent"], "mode": "yolo"} if "mode" in cfg["agent"] else cfg["agent"])
    agent.run(task)
    return agent.serialize()


def trial(root: Path, name: str, mini: dict, reward: float | None, atif: bool = True, own: bool = True) -> Path:
    """A harbor trial dir: agent/<mini's file>, agent/trajectory.json (harbor's ATIF), result.json."""
    from harbor.agents.installed.mini_swe_agent import convert_mini_swe_agent_to_atif

    agent = root / name / "agent"
    agent.mkdir(parents=True)
    if own:
        (agent / "mini-swe-agent.trajectory.json").write_text(json.dumps(mini, default=str))
    if atif:
        t = convert_mini_swe_agent_to_atif(mini, name)
        (agent / "trajectory.json").write_text(json.dumps(t.model_dump(mode="json", exclude_none=True)))
    if reward is not None:
        (root / name / "result.json").write_text(json.dumps({
            "task_name": "say-hi", "trial_name": name, "started_at": "2026-11-26T10:00:00Z",
            "finished_at": "2026-11-26T10:00:09Z", "verifier_result": {"rewards": {"reward": reward}}}))
    return agent


@pytest.fixture(scope="module")
def runs():
    return {"text": mini_run("Say hi.", toolcall=False), "tool": mini_run("Say hi.", toolcall=True)}


def table(out: Path, name: str) -> list[dict]:
    paths = CollectPaths(out)
    return (schema.read_dir(paths.turns, "turns") if name == "turns" else schema.read_table(paths.rollouts, name)).to_pylist()


def requests_of(out: Path) -> list[list[dict]]:
    return [json.loads(t["request"])["messages"] for t in sorted(table(out, "turns"), key=lambda t: (t["rollout_id"], t["turn"]))]


def sent(mini: dict) -> list[list[dict]]:
    """What mini's model was sent at each call: the messages before each assistant message."""
    msgs = [{"content": m.get("content"), **{k: m[k] for k in ("role", "tool_calls", "tool_call_id") if m.get(k)}}
            for m in mini["messages"] if m["role"] in ("system", "user", "assistant", "tool")]
    return [msgs[:i] for i, m in enumerate(msgs) if m["role"] == "assistant"]


def test_a_harbor_job_dir_imports_minis_own_files_with_the_verifier_reward(tmp_path, runs):
    job = tmp_path / "job"
    trial(job, "say-hi__a", runs["text"], 1.0)
    trial(job, "say-hi__b", runs["text"], 0.0)
    m = import_trajectories([job], tmp_path / "out")
    assert m["formats"] == ["mini"] and m["agent"] == "mini-swe-agent" and m["counts"] == {"finished": 2, "turns": 4}
    assert len(m["text_only_rollouts"]) == 2 and m["mean_reward"] == 0.5
    rollouts = table(tmp_path / "out", "rollouts")
    assert sorted(r["reward"] for r in rollouts) == [0.0, 1.0] and {r["task_id"] for r in rollouts} == {"say-hi"}
    turns = table(tmp_path / "out", "turns")
    assert all(t["text_only"] and t["prompt_token_ids"] == [] for t in turns)
    assert requests_of(tmp_path / "out")[:2] == sent(runs["text"])
    answer = json.loads(turns[0]["response"])["choices"][0]["message"]["content"]
    assert "```mswea_bash_command" in answer


def test_atif_holds_the_same_conversation_as_minis_own_file(tmp_path, runs):
    for kind in ("text", "tool"):
        agent = trial(tmp_path / kind, "say-hi__a", runs[kind], 1.0)
        import_trajectories([agent / "trajectory.json"], tmp_path / f"atif-{kind}")
        import_trajectories([agent / "mini-swe-agent.trajectory.json"], tmp_path / f"mini-{kind}")
        atif, own = requests_of(tmp_path / f"atif-{kind}"), requests_of(tmp_path / f"mini-{kind}")
        assert atif == own == sent(runs[kind]), kind
    assert any(m["role"] == "tool" and m["tool_call_id"] == "call_0" for m in own[1])
    (turn, *_) = table(tmp_path / "mini-tool", "turns")
    assert json.loads(turn["request"])["tools"][0]["function"]["name"] == "bash"  # mini's tool, as its model sends it


def test_imported_demonstrations_become_sft_rows(tmp_path, runs):
    from wharf.convert.stage import convert_round
    from wharf.core.batches import read_index
    from wharf.core.config import load_config

    trial(tmp_path / "job", "say-hi__a", runs["tool"], 1.0)
    import_trajectories([tmp_path / "job"], tmp_path / "imp")
    cfg = load_config(None, [f"convert.jobs=[{tmp_path / 'imp'}]", f"convert.out_dir={tmp_path / 'conv'}", "convert.mode=sft"])
    stats = convert_round(cfg, progress=False)
    assert stats["sft"]["text_only_rollouts"] == 1 and read_index(tmp_path / "conv").rollouts[0]["row_turns"] == [[0, 1]]


def test_bad_files_are_refused_by_file_and_field_and_nothing_is_written(tmp_path, runs):
    good = trial(tmp_path / "job", "say-hi__a", runs["text"], 1.0) / "mini-swe-agent.trajectory.json"
    atif = json.loads((good.parent / "trajectory.json").read_text())
    del atif["steps"][2]["source"]
    bad_atif = tmp_path / "bad" / "trajectory.json"
    bad_atif.parent.mkdir()
    bad_atif.write_text(json.dumps(atif))
    no_msgs = tmp_path / "x.traj.json"
    no_msgs.write_text(json.dumps({"trajectory_format": "mini-swe-agent-1.1", "info": {}}))
    other = tmp_path / "notes.json"
    other.write_text("{}")
    cases = [([good, bad_atif], "bad/trajectory.json: steps.2.source: Field required"),
             ([good, no_msgs], "x.traj.json: messages: missing"),
             ([other], "notes.json: neither an ATIF trajectory"),
             ([no_msgs.with_name("nope.json")], "nope.json: no such file")]
    for inputs, message in cases:
        with pytest.raises(TrajectoryError, match=message):
            import_trajectories(inputs, tmp_path / "out")
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    alone = tmp_path / "alone.traj.json"
    shutil.copy(good, alone)
    with pytest.raises(TrajectoryError, match="alone.traj.json: no verifier result .* --reward"):
        import_trajectories([alone], tmp_path / "out")
    assert import_trajectories([alone], tmp_path / "out", reward=1.0)["mean_reward"] == 1.0
    with pytest.raises(TrajectoryError, match="out: exists and is not empty"):
        import_trajectories([alone], tmp_path / "out", reward=1.0)


def test_a_dir_import_skips_and_reports_unreadable_files_and_strict_stops_at_the_first(tmp_path, runs, capsys):
    from wharf.collect.importers.cli import main

    job = tmp_path / "job"
    trial(job, "say-hi__a", runs["text"], 1.0)
    trial(job, "say-hi__b", runs["text"], 0.0)
    broken = job / "say-hi__c" / "agent" / "mini-swe-agent.trajectory.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")
    assert main([str(tmp_path / "strict"), str(job), "--strict"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"wharf import: {broken}: not a readable JSON file "
                                                            "(Expecting property name enclosed in double quotes: "
                                                            "line 1 column 2 (char 1))"]
    assert not (tmp_path / "strict").exists()
    assert main([str(tmp_path / "out"), str(job)]) == 0
    out = capsys.readouterr()
    assert out.err.strip().splitlines() == [f"wharf import: skipped {broken}: not a readable JSON file "
                                            "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"]
    assert "imported 2 trajectories" in out.out and "skipped 1 files" in out.out
    manifest = json.loads(CollectPaths(tmp_path / "out").manifest.read_text())
    assert manifest["counts"]["finished"] == 2 and [s["file"] for s in manifest["skipped"]] == [str(broken)]


def test_a_trial_without_result_json_is_named_by_its_trial_dir(tmp_path, runs):
    job = tmp_path / "job"
    trial(job, "say-hi__a", runs["text"], None, own=False)  # agent/trajectory.json (ATIF) alone
    trial(job, "fix-sum__b", runs["text"], None, atif=False)  # agent/mini-swe-agent.trajectory.json alone
    m = import_trajectories([job], tmp_path / "out", reward=1.0)
    assert m["tasks"] == ["fix-sum", "say-hi"] and m["counts"]["finished"] == 2
