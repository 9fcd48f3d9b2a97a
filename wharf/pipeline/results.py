"""What each stage returns to a Python caller (wharf.api) and to `wharf demo`: where it wrote, and
the figures it printed. Built from the stages' own records by pure functions; the training result
is the trainer's own record (wharf.train.records.TrainResult)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from wharf.collect.manifest import RoundSummary
from wharf.core.layout import CollectPaths, RunLayout
from wharf.train.records import TrainResult  # noqa: F401  (the API's training result)


@dataclass(frozen=True)
class CollectResult:
    """One collect round: its directory, files, and what its trials scored."""

    collect_dir: Path
    rollouts: Path  # rollouts.parquet
    manifest: Path
    planned: int
    finished: int
    resumed: int  # rollouts a resumed round kept from before
    statuses: dict[str, int]  # ok / agent_error / infra_error ... -> count
    mean_reward: float | None
    mixed_groups: list[str]  # tasks with both a success and a failure: what GRPO learns from
    text_only: int  # rollouts without token ids (convert.mode=sft only)
    prefix_cache: dict | None = field(default=None, repr=False)  # the endpoint's prompt tokens and cache hits

    @classmethod
    def of(cls, summary: RoundSummary, paths: CollectPaths) -> "CollectResult":
        return cls(collect_dir=paths.root, rollouts=paths.rollouts, manifest=paths.manifest, planned=summary.planned,
                   finished=len(summary.rows), resumed=summary.resumed, statuses=summary.counts,
                   mean_reward=summary.mean_reward, mixed_groups=summary.mixed_groups(),
                   text_only=len(summary.text_only), prefix_cache=summary.prefix_cache)

    def lines(self) -> list[str]:
        """What `wharf collect` prints."""
        mean = "-" if self.mean_reward is None else f"{self.mean_reward:.3f}"
        out = [f"collect: {self.finished}/{self.planned} rollouts ({self.resumed} resumed), status {self.statuses}, "
               f"mean reward {mean}",
               f"groups with both a success and a failure: {len(self.mixed_groups)} {self.mixed_groups}"]
        pc = self.prefix_cache
        if pc and pc.get("hit_rate") is not None:
            out.append(f"prefix cache: {pc['cached_tokens']} of {pc['prompt_tokens']} prompt tokens reused "
                       f"({pc['hit_rate']:.1%})")
        return [*out, f"wrote {self.collect_dir}"]


@dataclass(frozen=True)
class ConvertResult:
    """Micro-batches of one round (or of convert.jobs), and convert's stats.json figures."""

    convert_dir: Path
    rows: int
    rollouts_read: int
    rollouts_used: int
    groups_used: int
    wall_s: float
    stats: dict = field(repr=False)  # all of stats.json

    @classmethod
    def of(cls, stats: dict, convert_dir: Path) -> "ConvertResult":
        return cls(convert_dir=convert_dir, rows=stats["rows"]["count"], rollouts_read=stats["rollouts"]["read"],
                   rollouts_used=stats["rollouts"]["used"], groups_used=stats["groups"]["used"],
                   wall_s=stats["wall_s"], stats=stats)


@dataclass(frozen=True)
class LoopResult:
    """A loop's run: the rounds done (by this call or before it) and the policy it ended with."""

    run_dir: Path
    rounds: list[int]
    policy: str  # policy-v<last round + 1>
    adapter: Path
    report: Path

    @classmethod
    def of(cls, layout: RunLayout, rounds: list[int]) -> "LoopResult":
        last = rounds[-1]
        return cls(run_dir=layout.root, rounds=rounds, policy=layout.policy(last + 1),
                   adapter=layout.round(last).train.adapter, report=layout.report)


@dataclass(frozen=True)
class EvalResult:
    """Policies side by side: mean reward per policy label (this call's), and summary.json."""

    summary_path: Path
    dataset: str
    attempts: int
    mean_reward: dict[str, float]
    summary: dict = field(repr=False)

    @classmethod
    def of(cls, summary: dict, path: Path) -> "EvalResult":
        means = {label: summary["policies"][label]["reward"]["mean"] for label in summary["last"]}
        return cls(summary_path=path, dataset=summary["dataset"], attempts=summary["attempts"], mean_reward=means,
                   summary=summary)


@dataclass(frozen=True)
class ImportResult:
    """Trajectory files made into a collect dir of text-only rows (for convert.mode=sft)."""

    collect_dir: Path
    trajectories: int
    turns: int
    mean_reward: float | None

    @classmethod
    def of(cls, manifest: dict, out: Path) -> "ImportResult":
        return cls(collect_dir=out, trajectories=manifest["counts"]["finished"], turns=manifest["counts"]["turns"],
                   mean_reward=manifest.get("mean_reward"))


@dataclass(frozen=True)
class DemoResult:
    """`wharf demo`: one collect round, then its token-exactness audit."""

    collect: CollectResult
    audited: int  # rollouts whose completion ids were decoded and compared with the agent's own log
    problems: list[str]
    unread: int = 0  # rollouts without a trajectory the audit reads
    orphan_turns: int = 0  # turns rows of no rollout in rollouts.parquet (convert ignores them)
    abandoned: int = 0  # calls the agent hung up on

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        """What `wharf collect` and `wharf audit` print."""
        return [*self.collect.lines(), *self.problems,
                f"audited {self.audited} rollouts ({self.unread} without a trajectory we read): "
                f"{len(self.problems)} problems; {self.orphan_turns} orphan turns rows; {self.abandoned} abandoned calls"]
