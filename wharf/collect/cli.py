"""`wharf collect --config FILE [key=value ...]`: run one collect round (make collect)."""
from __future__ import annotations

from wharf.collect.runner import run
from wharf.core.config import cli_config
from wharf.core.entry import guarded


def main(argv: list[str] | None = None, prog: str = "wharf collect") -> int:
    cfg = cli_config(argv, prog, "Run one collect round: the agents' trials through the recording proxy.")
    return guarded(prog, lambda: _collect(cfg))


def _collect(cfg) -> int:
    summary = run(cfg)
    out = cfg.round_layout.collect
    mean = "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    print(f"round {cfg.round}: {len(summary.rows)}/{summary.planned} rollouts "
          f"({summary.resumed} resumed), status {summary.counts}, mean reward {mean}")
    print(f"groups with both a success and a failure: {len(summary.mixed_groups())} {summary.mixed_groups()}")
    if summary.prefix_cache and summary.prefix_cache["hit_rate"] is not None:
        pc = summary.prefix_cache
        print(f"prefix cache: {pc['cached_tokens']} of {pc['prompt_tokens']} prompt tokens reused "
              f"({pc['hit_rate']:.1%})")
    if summary.text_only:
        print(f"{len(summary.text_only)} rollouts are text-only (the endpoint returned no token ids): "
              "convert them with convert.mode=sft; GRPO refuses them")
    print(f"wrote {out.rollouts}, {out.turns}/, {out.manifest}")
    return 0
