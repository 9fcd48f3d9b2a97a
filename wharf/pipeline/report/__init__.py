"""The run report: runs/<run>/report.html and its PNG plots, rewritten after every round.

`write_report(run_dir)` reads what the stages left in the run dir (wharf/pipeline/report/data.py) and
writes a self-contained page: the plots as files beside it (relative paths), the tables inline,
no scripts, so it opens from the file system with nothing running.
Besides the tables and plots: the latest round's sample trajectories (samples.py) and the run's
resolved config, credentials redacted (sections.py).
`python -m wharf.pipeline.report RUN_DIR` (or `--compare LABEL=RUN_DIR ... --out FILE.png`).
"""
from __future__ import annotations

import html
import os
from pathlib import Path

from wharf.core import atomic, storage
from wharf.core.layout import RunLayout

from . import sections
from .data import STAGES, RoundData, gather, gather_evals
from .draw import draw_all, plot_set
from .oneround import CURVES
from .samples import Sample, read_samples

__all__ = ["write_report", "render", "gather"]


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.2e}" if 0 < abs(v) < 10 ** -digits else f"{v:.{digits}f}"  # mismatch: 1e-6 is not 0
    return html.escape(str(v))


def _table(head: list[str], rows: list[list]) -> str:
    th = "".join(f"<th>{html.escape(h).replace('/', '/<wbr>')}</th>" for h in head)  # headers wrap, cells do not
    trs = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in row) + "</tr>" for row in rows)
    # In a box of its own that scrolls sideways: a wide table (the rounds have 23 columns) never
    # widens the page past the window.
    return f"<div class='tbl'><table><tr>{th}</tr>{trs}</table></div>"


def _round_rows(rounds: list[RoundData]) -> list[list]:
    return [[r.k, r.policy, r.rollouts, r.mean_reward, r.success_rate,
             None if r.successes is None else f"{r.multi_call_successes}/{r.successes}", r.groups_with_signal, r.groups_used,
             r.calls / r.rollouts if r.calls and r.rollouts else None, r.rows, r.rows_per_rollout, r.prefix_breaks,
             r.trainable_tokens, r.response_tokens, len(r.steps), r.step_mean("loss"),
             r.mismatch_mean, r.shift.get("delta_mean"), r.shift.get("kl"), *[r.walls.get(s) for s in STAGES]]
            for r in rounds]


def _health_rows(rounds: list[RoundData]) -> list[list]:
    return [[r.k, c.get("name"), "ok" if c.get("ok") else "FAILED", c.get("expected"), c.get("seen"), c.get("file")]
            for r in rounds for c in r.health]


def _job_rows(rounds: list[RoundData]) -> list[list]:
    return [[r.k, j.get("name"), j.get("dir"), j.get("policies"), j.get("tokens"), j.get("mismatch_mean"),
             j.get("mismatch_max"), j.get("ratio_mean"), j.get("ratio_p95"), j.get("kl")]
            for r in rounds for j in r.jobs]


def _rule_rows(rounds: list[RoundData]) -> list[list]:
    return [[r.k, rule, v.get("rollouts"), v.get("count"), v.get("tokens")]
            for r in rounds for rule, v in sorted(r.rules.items()) if isinstance(v, dict)]


CSS = ("body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;font-size:13px}"
       "td,th{border:1px solid #ccc;padding:3px 5px;text-align:right}th{vertical-align:bottom}td{white-space:nowrap}"
       ".tbl{max-width:100%;overflow-x:auto}"  # the first column (the round) stays in view while it scrolls
       "td:first-child,th:first-child{position:sticky;left:0;background:#fff}"
       "img{max-width:100%;display:block}figure{margin:1.5em 0}" + sections.CSS)


def _iv(d: dict) -> str:
    ok = all(isinstance(d.get(k), (int, float)) for k in ("low", "high"))
    return f"[{d['low']:.3f}, {d['high']:.3f}]" if ok else "–"


def _eval_rows(evals: list[tuple[str, dict]]) -> tuple[list[list], list[list]]:
    """Per policy: trials, mean reward and its interval, pass@1, pass@k; per pair: the difference."""
    pol, diff = [], []
    for name, s in evals:
        for e in s["policies"].values():
            r, pk = e.get("reward") or {}, e.get("pass_at") or {}
            top = max(pk, key=int) if pk else None
            pol.append([name, e.get("spec"), e.get("trials"), r.get("mean"), _iv(r), pk.get("1"),
                        f"pass@{top} {pk[top]:.3f}" if top else None])
        for d in (s.get("paired") or {}).values():
            specs = [s["policies"].get(d.get(x), {}).get("spec") for x in ("a", "b")]
            diff.append([name, f"{specs[0]} − {specs[1]}", d.get("pairs"), d.get("mean"), _iv(d)])
    return pol, diff


def render(name: str, rounds: list[RoundData], images: dict[str, tuple[str, str]],
           evals: list[tuple[str, dict]] = (), samples: list[Sample] = (), config: str | None = None) -> str:
    """The page, given the plots (name -> title, path relative to the page), the latest round's
    sample trajectories and the redacted config text (pure: no I/O)."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>wharf run {html.escape(name)}</title>"
             f"<style>{CSS}</style></head><body><h1>wharf run {html.escape(name)}</h1>"]
    if not rounds:
        parts.append("<p>No rounds yet.</p>")
    else:
        head = ["round", "policy", "rollouts", "mean reward", "success", "successes in >= 2 calls", "groups w/ signal",
                "groups used", "calls/rollout", "rows", "rows/rollout", "prefix breaks", "trainable tokens", "tokens/call", "steps", "loss", "mismatch", "|Δ log-prob|", "KL to prev", *[f"{s} s" for s in STAGES]]
        parts.append("<section id='rounds'><h2>Rounds</h2>" + _table(head, _round_rows(rounds)) + "</section>")
        health = _health_rows(rounds)
        if health:  # text-aligned: the sentences read left to right
            parts.append("<h2>Loop health</h2>" + _table(["round", "check", "result", "expected", "seen", "file"],
                                                          health).replace("<td>", "<td style='text-align:left'>"))
        overlap = [[r.k, r.policy, r.overlap.get("lag"), r.overlap.get("mismatch"), r.overlap.get("is_weight_mean"),
                    r.overlap.get("is_capped"),
                    r.overlap.get("collect_waited_s"), r.overlap.get("train_waited_s")] for r in rounds if r.overlap]
        if overlap:
            parts.append("<h2>Overlapping rounds (loop.max_staleness)</h2>" + _table(
                ["round", "sampled by", "lag", "|log-ratio| to the start policy", "importance weight", "share at cap",
                 "collect waited for its policy s",
                 "train waited for the collect s"], overlap))
        rules = _rule_rows(rounds)
        if rules:
            parts.append("<h2>What convert masked or dropped</h2>" + _table(
                ["round", "rule", "rollouts", "calls/rows", "loss tokens"], rules))
        jobs = _job_rows(rounds)
        if jobs:
            parts.append("<h2>Jobs (how far off-policy)</h2>" + _table(
                ["round", "job", "dir", "policies", "tokens", "mismatch mean", "mismatch max", "ratio mean",
                 "ratio p95", "KL est."], jobs))
    if evals:
        pol, diff = _eval_rows(list(evals))
        parts.append("<h2>Evaluations (wharf eval, the loop's held-out split)</h2><p>95% t intervals over per-task "
                     "means; differences paired by task and attempt (the same seeds).</p>"
                     + _table(["eval", "policy", "trials", "mean reward", "95% interval", "pass@1", "pass@k"], pol))
        if diff:
            parts.append(_table(["eval", "difference", "pairs", "mean", "95% interval"], diff))
    parts.append(_plots(rounds, images))
    if rounds:
        parts.append(sections.samples_html(list(samples), rounds[-1].k))
    parts.append(sections.config_html(config))
    parts.append("</body></html>")
    return "\n".join(parts)


def _plots(rounds: list[RoundData], images: dict[str, tuple[str, str]]) -> str:
    parts = ["<section id='plots'>"]
    if len(rounds) == 1:
        parts.append(f"<p>One round so far: the plots show what round {rounds[0].k} holds. The curves over rounds "
                     f"({CURVES}) are drawn from the second round on (<code>wharf loop rounds=N</code>).</p>")
    for key, (title, src) in images.items():
        title, src = html.escape(title), html.escape(src)
        parts.append(f"<figure id='plot-{key}'><h2>{title}</h2><img src='{src}' alt='{title}'></figure>")
    optional = {"offpolicy", "reward"} if len(rounds) == 1 else {"offpolicy"}  # a replay's; an evaluated round's
    missing = [t for k, (t, _, _) in plot_set(rounds).items() if k not in images and k not in optional]
    if missing and rounds:
        parts.append("<p>Not drawn yet (no data): " + html.escape(", ".join(missing)) + ".</p>")
    return "\n".join(parts) + "</section>"


# What the report reads of a run in object storage (pulled into its mirror first).
READS = ("rounds/*/health.json", "rounds/*/done/*.json", "rounds/*/collect/manifest.json",
         "rounds/*/collect/rollouts.parquet", "rounds/*/collect/turns/part-*.parquet", "rounds/*/convert/stats.json",
         "rounds/*/train/metrics.jsonl", "rounds/*/train/result.json", "rounds/*/train/shift.json",
         "rounds/*/train/offpolicy.json")


def write_report(run_dir: str | Path) -> Path:
    """Rewrite report.html and its plots for the run at `run_dir` (a path, or a URL: s3://...);
    returns the page's path (in the run's local mirror for a URL, the page uploaded beside the run)."""
    layout = RunLayout(storage.local_path(run_dir))
    storage.pull(layout.root, READS)
    rounds = gather(layout.root)
    written = draw_all(rounds, layout.report_assets)
    images = {k: (title, os.path.relpath(p, layout.root)) for k, (title, p) in written.items()}
    for stale in layout.report_assets.glob("*.png"):  # a plot whose data went away
        if stale not in {p for _, p in written.values()}:
            stale.unlink()
    samples = read_samples(layout.round(rounds[-1].k)) if rounds else []
    page = render(layout.root.name, rounds, images, gather_evals(layout), samples, sections.config_text(layout.config))
    atomic.write_text(layout.report, page)
    storage.push(layout.report_assets, delete_stale=True)
    storage.push_file(layout.report)
    return layout.report
