"""`wharf demo [--config FILE] [key=value ...]` (make demo): the main job on the embedded default,
one collect round on the bundled toy tasks, then the token-exactness audit of what it recorded,
then the run's report (runs/default/report.html).

Without --config it runs the default config wharf carries (configs/default.yaml), whose tasks
(datasets/toy) come with wharf too, so it runs from any directory after `pip install`; the run
goes to ./runs/default.
"""
from __future__ import annotations

from pathlib import Path

from wharf.core.config import RunConfig, cli_config
from wharf.core.entry import guarded
from wharf.core.model_store import resolve_model_dir
from wharf.pipeline.results import CollectResult, DemoResult


def tokenizer_dir(cfg: RunConfig) -> Path | None:
    """The tokenizer the served model's ids decode with: the local engine's model; for vLLM its
    model when that is a local dir; None when there is none here to read."""
    if cfg.endpoint.kind == "local":
        return resolve_model_dir(cfg.engine.model)
    path = Path(cfg.endpoint.model).expanduser()
    return path if (path / "config.json").is_file() else None


def run_demo(cfg: RunConfig, progress: bool = True) -> DemoResult:
    from transformers import AutoTokenizer

    from wharf.collect.audit import audit_round
    from wharf.collect.runner import run

    collected = CollectResult.of(run(cfg, progress=progress), cfg.round_layout.collect)
    tok_dir = tokenizer_dir(cfg)
    if tok_dir is None:
        return DemoResult(collected, 0, [f"audit: no local tokenizer for endpoint.model={cfg.endpoint.model!r}: "
                                         f"run `wharf audit {collected.collect_dir} --tokenizer DIR`"])
    tok = AutoTokenizer.from_pretrained(tok_dir)
    report = audit_round(collected.collect_dir, lambda ids: tok.decode(ids), tok.eos_token or "")
    return DemoResult(collected, report.checked, report.problems, unread=len(report.skipped),
                      orphan_turns=sum(report.orphan_turns.values()), abandoned=report.abandoned)


def main(argv: list[str] | None = None, prog: str = "wharf demo") -> int:
    args = list(argv or [])
    if "--config" not in args and not any(a.startswith("--config=") for a in args) and "-h" not in args \
            and "--help" not in args:
        args = ["--config", "default", *args]  # the default config wharf carries
    cfg = cli_config(args, prog, "One collect round on the bundled toy tasks, then its token-exactness audit.")
    return guarded(prog, lambda: _demo(cfg))


def _demo(cfg: RunConfig) -> int:
    from wharf.pipeline.report import write_report

    result = run_demo(cfg)
    print("\n".join(result.lines()))
    print(f"report: {write_report(cfg.layout.root)}")  # the round's tasks, answers, sample trajectories
    return 0 if result.ok else 1
