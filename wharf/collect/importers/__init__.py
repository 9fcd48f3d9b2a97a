"""`wharf import OUT FILE|DIR ... [--reward R] [--task ID]`: trajectory files users already have ->
a collect dir of the same schema (turns shards, rollouts.parquet, manifest.json), every call
text-only: convert.mode=sft renders them with the student's template; GRPO refuses them.

One rollout per file (formats.py: ATIF trajectory.json, mini-swe-agent's trajectory, wharf's own
minimal agent's trajectory.json). Its reward
is the harbor trial's verifier result (result.json in the trial dir the file sits in, two levels
up: <trial>/agent/<file>), else --reward; neither is an error naming the file. In a directory,
every trajectory.json and *.traj.json / mini-swe-agent.trajectory.json is taken, and a trial's
ATIF file is skipped where mini-swe-agent's own sits beside it (the same run, with its exact
messages). A file found in a directory that cannot be imported is skipped and reported (the
manifest's `skipped`; `strict` refuses it instead); a file named on the command line is always
refused. The task id is --task, else harbor's task name (result.json), else the file's name, else
the trial dir's (<task>__<id>/agent/trajectory.json). Everything is checked before anything is
written, and the dir appears whole (a temp dir renamed into place) or not at all.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from wharf.core import schema
from wharf.core.layout import CollectPaths

from .formats import ImportUsageError, Trajectory, TrajectoryError, parse

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


def find_files(inputs: list[Path]) -> list[tuple[Path, bool]]:
    """(file, named on the command line): explicit files as given; in directories, the trajectory
    files (see the module's doc). A file reached twice is refused: it would be two rollouts with one id."""
    out: list[tuple[Path, bool]] = []
    for p in inputs:
        if p.is_file():
            out.append((p, True))
            continue
        if not p.is_dir():
            raise ImportUsageError(f"{p}: no such file or directory")
        found = [f for f in sorted(p.rglob("*.json")) if f.name in MINI_NAMES or f.name.endswith(".traj.json")
                 or (f.name == "trajectory.json" and not any((f.parent / m).is_file() for m in MINI_NAMES))]
        if not found:
            raise TrajectoryError(f"{p}: no trajectory file in it (trajectory.json, *.traj.json, "
                                  "mini-swe-agent.trajectory.json)")
        out += [(f, False) for f in found]
    seen: dict[Path, Path] = {}
    for f, _ in out:
        if f.resolve() in seen:
            also = "" if seen[f.resolve()] == f else f" (also as {seen[f.resolve()]})"
            raise ImportUsageError(f"{f}: named twice{also}: name each trajectory once, or it becomes two "
                                   "rollouts with one id")
        seen[f.resolve()] = f
    return out


def _mapping(value, where: str, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TrajectoryError(f"{where}: {what}: expected a mapping, got {value!r:.60} (harbor writes its trial "
                              "result there)")
    return value


def _trial_result(path: Path) -> dict | None:
    """harbor's result.json of the trial `path` belongs to (<trial>/agent/<file>), if any."""
    f = path.parent.parent / "result.json"
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text())
    except ValueError as e:
        raise TrajectoryError(f"{f}: not JSON ({e})") from None
    result = _mapping(data, str(f), "the top level")
    verifier = _mapping(result.get("verifier_result"), str(f), "verifier_result")
    _mapping(verifier.get("rewards"), str(f), "verifier_result.rewards")
    if result.get("task_name") is not None and not isinstance(result["task_name"], str):
        raise TrajectoryError(f"{f}: task_name: expected text, got {result['task_name']!r:.60}")
    return result


def _time(value, default: dt.datetime) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else default
    except ValueError:
        return default


def _reward(path: Path, result: dict | None, reward: float | None) -> tuple[float, dict]:
    """The verifier's reward in the trial's result.json, else --reward."""
    rewards = ((result or {}).get("verifier_result") or {}).get("rewards")
    where = path.parent.parent / "result.json"
    if rewards:
        got = rewards.get("reward", next(iter(rewards.values())) if len(rewards) == 1 else None)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise TrajectoryError(f"{where}: verifier_result.rewards {rewards} has no numeric 'reward' key")
        if not math.isfinite(got):
            raise TrajectoryError(f"{where}: verifier_result.rewards.reward is {got}: not a finite number")
        return float(got), rewards
    if reward is not None:
        return reward, {"reward": reward}
    raise TrajectoryError(f"{path}: no verifier result (no harbor result.json with verifier_result.rewards "
                          "in its trial dir): give the reward with --reward")


def task_of(path: Path, result: dict | None, task: str | None) -> str:
    """--task, else harbor's task name, else the file's name, else its trial dir's (<task>__<id>)."""
    if task or (result or {}).get("task_name"):
        return task or result["task_name"]
    stem = path.name.split(".")[0]
    if stem not in ("trajectory", "mini-swe-agent"):  # a bare file name says nothing of the task
        return stem
    if path.parent.name != "agent":
        return path.parent.name
    trial = path.parent.parent.name  # harbor's <trial>/agent/<file>, the trial named <task>__<id>
    return trial.rpartition("__")[0] or trial


def read_one(path: Path, reward: float | None, task: str | None) -> Imported:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TrajectoryError(f"{path}: not a readable JSON file ({e})") from None
    traj = parse(data, str(path))
    result = _trial_result(path)
    got, rewards = _reward(path, result, reward)
    mtime = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)
    return Imported(path, traj, task_of(path, result, task), got, rewards,
                    _time((result or {}).get("started_at"), mtime), _time((result or {}).get("finished_at"), mtime))


def read_all(found: list[tuple[Path, bool]], reward: float | None, task: str | None,
             strict: bool) -> tuple[list[Imported], list[tuple[Path, str]]]:
    """Every file read and checked; one found in a directory that cannot be is skipped and
    reported (`strict`: refused, as a file named on the command line always is)."""
    items, skipped = [], []
    for f, named in found:
        try:
            items.append(read_one(f, reward, task))
        except TrajectoryError as e:
            if named or strict:
                raise
            skipped.append((f, str(e)))
    if not items:
        raise TrajectoryError(f"none of the {len(skipped)} trajectory files could be imported; the first: "
                              f"{skipped[0][1]}")
    return items, skipped


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


def check_out(out: Path, reward: float | None, task: str | None) -> None:
    above = next((d for d in out.parents if d.exists()), None)
    if above is not None and not above.is_dir():
        raise ImportUsageError(f"{out}: {above} is a file, not a directory")
    if task is not None and not task.strip():
        raise ImportUsageError("--task: empty; name the task, or leave --task out")
    if out.is_file():
        raise ImportUsageError(f"{out}: is a file, not a collect dir: the dir to write comes first "
                               "(wharf import OUT FILE|DIR ...)")
    if out.exists() and any(out.iterdir()):
        raise ImportUsageError(f"{out}: exists and is not empty; import into a new directory")
    if reward is not None and (isinstance(reward, bool) or not math.isfinite(reward)):
        raise ImportUsageError(f"--reward {reward}: not a finite number")


def import_trajectories(inputs: list[Path], out: Path, reward: float | None = None,
                        task: str | None = None, strict: bool = False) -> dict:
    """Write the collect dir `out` (which must not exist or be empty); returns its manifest, whose
    `skipped` lists the files of a directory that could not be imported and why."""
    check_out(out, reward, task)
    items, skipped = read_all(find_files(inputs), reward, task, strict)  # all checked before anything is written
    files = [it.path for it in items]
    job_id = "import-" + hashlib.sha1("\n".join(sorted(str(f.resolve()) for f in files)).encode()).hexdigest()[:12]
    turns, rollouts = _rows(items, job_id)
    agents = sorted({it.traj.agent for it in items})
    manifest = {"job_id": job_id, "round": 0, "policy": rollouts[0]["policy"], "dataset": None,
                "tasks": sorted({r["task_id"] for r in rollouts}), "agent": agents[0] if len(agents) == 1 else "import",
                "imported_from": [str(f) for f in files], "formats": sorted({it.traj.format for it in items}),
                "state": "done", "counts": {"finished": len(rollouts), "turns": len(turns)},
                "mean_reward": sum(it.reward for it in items) / len(items),
                "text_only_rollouts": sorted(r["rollout_id"] for r in rollouts),
                "skipped": [{"file": str(f), "error": e} for f, e in skipped]}
    _write(out, turns, rollouts, manifest)
    return manifest


def _write(out: Path, turns: list[dict], rollouts: list[dict], manifest: dict) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrajectoryError(f"{out.parent}: cannot make it ({e.strerror})") from None
    tmp = out.with_name(f".{out.name}.import-{uuid.uuid4().hex[:8]}")
    try:
        paths = CollectPaths(tmp)
        schema.write_table(paths.turns / "part-00000.parquet", "turns", turns)
        schema.write_table(paths.rollouts, "rollouts", rollouts)
        paths.manifest.write_text(json.dumps(manifest, indent=1))
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except OSError as e:  # a full disk, a directory without write permission
        raise TrajectoryError(f"{out}: cannot write it ({e.strerror}); nothing written") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
