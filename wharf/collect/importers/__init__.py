"""`wharf import OUT FILE|DIR ... [--reward R] [--task ID]`: trajectory files users already have ->
a collect dir of the same schema (turns shards, rollouts.parquet, manifest.json), every call
text-only: convert.mode=sft renders them with the student's template; GRPO refuses them.

One rollout per file (formats.py: ATIF trajectory.json, mini-swe-agent's trajectory). Its reward
is the harbor trial's verifier result (result.json in the trial dir the file sits in, two levels
up: <trial>/agent/<file>), else --reward; neither is an error naming the file. In a directory,
every trajectory.json and *.traj.json / mini-swe-agent.trajectory.json is taken, and a trial's
ATIF file is skipped where mini-swe-agent's own sits beside it (the same run, with its exact
messages). Everything is checked before anything is written, and the dir appears whole (a temp
dir renamed into place) or not at all.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from wharf.core import schema
from wharf.core.layout import CollectPaths

from .formats import Trajectory, TrajectoryError, parse

MINI_NAMES = ("mini-swe-agent.trajectory.json",)


@dataclass
class Imported:
    path: Path
    traj: Trajectory
    task_id: str
    reward: float
    rewards: dict
    started: dt.datetime
    ended: dt.datetime


def find_files(inputs: list[Path]) -> list[Path]:
    """Explicit files as given; in directories, the trajectory files (see the module's doc)."""
    out: list[Path] = []
    for p in inputs:
        if p.is_file():
            out.append(p)
            continue
        if not p.is_dir():
            raise TrajectoryError(f"{p}: no such file or directory")
        for f in sorted(p.rglob("*.json")):
            if f.name in MINI_NAMES or f.name.endswith(".traj.json"):
                out.append(f)
            elif f.name == "trajectory.json" and not any((f.parent / m).is_file() for m in MINI_NAMES):
                out.append(f)
    if not out:
        raise TrajectoryError(f"{', '.join(map(str, inputs))}: no trajectory file (trajectory.json, *.traj.json, "
                              "mini-swe-agent.trajectory.json)")
    return out


def _trial_result(path: Path) -> dict | None:
    """harbor's result.json of the trial `path` belongs to (<trial>/agent/<file>), if any."""
    f = path.parent.parent / "result.json"
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text())
    except ValueError as e:
        raise TrajectoryError(f"{f}: not JSON ({e})") from None


def _time(value, default: dt.datetime) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else default
    except ValueError:
        return default


def read_one(path: Path, reward: float | None, task: str | None) -> Imported:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TrajectoryError(f"{path}: not a readable JSON file ({e})") from None
    traj = parse(data, str(path))
    result = _trial_result(path)
    rewards = ((result or {}).get("verifier_result") or {}).get("rewards")
    if rewards:
        got = rewards.get("reward", next(iter(rewards.values())) if len(rewards) == 1 else None)
        if not isinstance(got, (int, float)):
            raise TrajectoryError(f"{path.parent.parent / 'result.json'}: verifier_result.rewards {rewards} has no "
                                  "'reward' key")
    elif reward is not None:
        got, rewards = reward, {"reward": reward}
    else:
        raise TrajectoryError(f"{path}: no verifier result (no harbor result.json with verifier_result.rewards "
                              "in its trial dir): give the reward with --reward")
    mtime = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)
    task_id = task or (result or {}).get("task_name") or path.name.split(".")[0]
    if task_id in ("trajectory", "mini-swe-agent"):  # a bare file name says nothing of the task
        task_id = path.parent.name
    return Imported(path, traj, task_id, float(got), rewards, _time((result or {}).get("started_at"), mtime),
                    _time((result or {}).get("finished_at"), mtime))


def _rows(items: list[Imported], job_id: str) -> tuple[list[dict], list[dict]]:
    turns, rollouts, attempts = [], [], {}
    for it in items:
        rid = hashlib.sha1(str(it.path.resolve()).encode()).hexdigest()[:16]
        policy = it.traj.model or it.traj.agent
        for k, (messages, answer) in enumerate(it.traj.calls):
            req = {"model": policy, "messages": messages, **({"tools": it.traj.tools} if it.traj.tools else {})}
            finish = "tool_calls" if answer.get("tool_calls") else "stop"
            resp = {"object": "chat.completion", "model": policy,
                    "choices": [{"index": 0, "message": answer, "finish_reason": finish}]}
            turns.append({"rollout_id": rid, "turn": k, "request_id": f"{rid}-{k}", "api": "chat", "policy": policy,
                          "started_at": it.started, "ended_at": it.ended, "request": json.dumps(req),
                          "response": json.dumps(resp), "sampling": "{}", "prompt_token_ids": [],
                          "completion_token_ids": [], "completion_logprobs": [], "finish_reason": finish,
                          "status": "ok", "error": None, "text_only": True})
        attempt = attempts[it.task_id] = attempts.get(it.task_id, -1) + 1
        rollouts.append({"rollout_id": rid, "job_id": job_id, "round": 0, "task_id": it.task_id,
                         "group_id": it.task_id, "attempt": attempt, "policy": policy, "reward": it.reward,
                         "rewards": json.dumps(it.rewards), "status": "ok", "n_turns": len(it.traj.calls),
                         "started_at": it.started, "ended_at": it.ended, "trial_dir": str(it.path), "error": None})
    return turns, rollouts


def import_trajectories(inputs: list[Path], out: Path, reward: float | None = None,
                        task: str | None = None) -> dict:
    """Write the collect dir `out` (which must not exist or be empty); returns its manifest."""
    if out.exists() and any(out.iterdir()):
        raise TrajectoryError(f"{out}: exists and is not empty; import into a new directory")
    files = find_files(inputs)
    items = [read_one(f, reward, task) for f in files]  # every file checked before anything is written
    job_id = "import-" + hashlib.sha1("\n".join(sorted(str(f.resolve()) for f in files)).encode()).hexdigest()[:12]
    turns, rollouts = _rows(items, job_id)
    agents = sorted({it.traj.agent for it in items})
    manifest = {"job_id": job_id, "round": 0, "policy": rollouts[0]["policy"], "dataset": None,
                "tasks": sorted({r["task_id"] for r in rollouts}), "agent": agents[0] if len(agents) == 1 else "import",
                "imported_from": [str(f) for f in files], "formats": sorted({it.traj.format for it in items}),
                "state": "done", "counts": {"finished": len(rollouts), "turns": len(turns)},
                "mean_reward": sum(it.reward for it in items) / len(items),
                "text_only_rollouts": sorted(r["rollout_id"] for r in rollouts)}
    _write(out, turns, rollouts, manifest)
    return manifest


def _write(out: Path, turns: list[dict], rollouts: list[dict], manifest: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.import-{uuid.uuid4().hex[:8]}")
    try:
        paths = CollectPaths(tmp)
        schema.write_table(paths.turns / "part-00000.parquet", "turns", turns)
        schema.write_table(paths.rollouts, "rollouts", rollouts)
        paths.manifest.write_text(json.dumps(manifest, indent=1))
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
