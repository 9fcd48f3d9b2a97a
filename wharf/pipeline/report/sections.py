"""The report's sample trajectories and resolved config as HTML (pure), and the config read from
the run dir with its credentials redacted (the page may be shared, or uploaded beside the run)."""
from __future__ import annotations

import html
from pathlib import Path

import yaml

from wharf.core.config_redact import redacted_mapping

from .samples import MAX_CHARS, Call, Message, Sample

CSS = ("details{margin:.6em 0}summary{cursor:pointer;font-weight:bold}.call{margin:.4em 0 .8em 1.2em}"
       ".msg{margin:.2em 0}.msg pre{white-space:pre-wrap;word-break:break-word;margin:.1em 0 .1em 1em;"
       "font-size:12px;background:#f6f6f6;padding:4px}.role{font-size:12px;color:#555}"
       ".answer pre{background:#eef5ff}pre.config{font-size:12px;background:#f6f6f6;padding:6px}")


def config_text(path: Path) -> str | None:
    """The run's resolved config.yaml as YAML with every credential redacted; None without one."""
    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return yaml.safe_dump(redacted_mapping(cfg), sort_keys=False) if isinstance(cfg, dict) else None


def _cut(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    return f"{text[:MAX_CHARS]}\n… ({len(text) - MAX_CHARS} more characters)"


def _message(m: Message, cls: str = "msg") -> str:
    return (f"<div class='{cls}'><span class='role'>{html.escape(m.role)}</span>"
            f"<pre>{html.escape(_cut(m.text)) or '<i>(empty)</i>'}</pre></div>")


def _call(c: Call) -> str:
    head = f"call {c.turn}" + (f", finish: {html.escape(str(c.finish_reason))}" if c.finish_reason else "")
    if c.status and c.status != "ok":
        head += f", status: {html.escape(c.status)}"
    note = " (the request re-sent its history: all of it shown)" if c.resent else ""
    body = "".join(_message(m) for m in c.new)
    return (f"<div class='call'><b>{head}</b>{note}{body}"
            f"{_message(c.answer, 'msg answer')}</div>")


def _reward(v) -> str:
    return "none" if v is None else f"{v:g}"


def _sample(s: Sample, open_: bool) -> str:
    r = s.rollout
    summary = (f"{s.which} of group {html.escape(str(r['group_id']))}: attempt {r.get('attempt')}, reward "
               f"{_reward(r['reward'])} (the group's: {', '.join(_reward(v) for v in s.group_rewards)}), "
               f"{len(s.calls)} call(s), status {html.escape(str(r.get('status')))}"
               + (f", {r['n_errors']} upstream call error(s)" if r.get("n_errors") else ""))
    calls = "".join(_call(c) for c in s.calls) or "<p>No model call was recorded for this rollout.</p>"
    return (f"<details class='sample'{' open' if open_ else ''}><summary>{summary}</summary>"
            f"<p>rollout {html.escape(str(r['rollout_id']))}, task {html.escape(str(r['task_id']))}</p>{calls}</details>")


def samples_html(samples: list[Sample], k: int) -> str:
    if not samples:
        return ""
    intro = (f"<p>Round {k}: in each group (one task's attempts), the rollout with the highest reward and the one "
             "with the lowest; each model call shows the messages it added and the answer it got.</p>")
    return (f"<section id='samples'><h2>Sample trajectories</h2>{intro}"
            + "".join(_sample(s, i < 2) for i, s in enumerate(samples)) + "</section>")


def config_html(text: str | None) -> str:
    if text is None:
        return ""
    return ("<section id='config'><h2>Config</h2><details><summary>The run's resolved config "
            "(config.yaml; credentials redacted)</summary>"
            f"<pre class='config'>{html.escape(text)}</pre></details></section>")
