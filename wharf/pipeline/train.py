"""`wharf train --config FILE [key=value ...]` (`python -m wharf.train`): train round `round`, running
convert first when its micro-batches are missing, and publish the adapter when an endpoint answers."""
from __future__ import annotations

from wharf.convert.stage import convert_round
from wharf.train.stage import train_round
from wharf.core.config import cli_config
from wharf.core.entry import guarded


def main(argv: list[str] | None = None, prog: str = "wharf train") -> int:
    cfg = cli_config(argv, prog, "LoRA GRPO on round `round`'s micro-batches (convert runs first when they are "
                                 "missing); publishes the adapter as policy-v<round+1> when an endpoint answers.")
    return guarded(prog, lambda: _train(cfg))


def _train(cfg) -> int:
    r = train_round(cfg, convert=convert_round)
    mm = "n/a" if r.mismatch_mean is None else f"{r.mismatch_mean:.2e} mean, {r.mismatch_max:.2e} max"
    print(f"round {r.round}: {r.steps} steps ({r.skipped_steps} skipped), {r.loss_tokens} loss tokens, "
          f"{r.wall_s:.0f} s; first-step |logp - stored|: {mm}")
    print(f"adapter {r.policy}: {r.adapter}")
    print(r.publish_message or "not published (train.publish=false)")
    return 0
