"""The run report on a run dir written the way the stages write theirs (real parquet through
wharf.schema, convert's stats.json, train's metrics.jsonl, the loop's markers): every plot with
data is drawn, the page references only files that exist, and a partial run still gets a page."""
from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from wharf.core import schema
from wharf.core.layout import RunLayout
from wharf.pipeline.stages import write_marker
from wharf.pipeline.report import gather, write_report
from wharf.pipeline.report.cli import main as report_main

NOW = dt.datetime(2026, 11, 23, tzinfo=dt.timezone.utc)


def _rollouts(k: int, successes: dict[str, int], attempts: int = 4) -> list[dict]:
    rows = []
    for task, n_ok in successes.items():
        for a in range(attempts):
            rows.append({"rollout_id": f"r{k}-{task}-{a}", "job_id": f"job{k}", "round": k, "task_id": task,
                         "group_id": f"job{k}.{task}", "attempt": a, "policy": f"policy-v{k}" if k else "base",
                         "reward": 1.0 if a < n_ok else 0.0, "rewards": "{}", "status": "ok", "n_turns": 1,
                         "started_at": NOW, "ended_at": NOW, "trial_dir": "", "error": None})
    return rows


def _turns(rows: list[dict], n_tokens: int) -> list[dict]:
    return [{"rollout_id": r["rollout_id"], "turn": 0, "request_id": "x", "api": "chat", "policy": r["policy"],
             "started_at": NOW, "ended_at": NOW, "request": "{}", "response": "{}", "sampling": "{}",
             "prompt_token_ids": [1, 2, 3], "completion_token_ids": list(range(n_tokens)),
             "completion_logprobs": [-0.5] * n_tokens, "finish_reason": "stop", "status": "ok", "error": None}
            for r in rows]


def make_round(layout: RunLayout, k: int, successes: dict[str, int], train: bool = True) -> None:
    rnd = layout.round(k)
    rows = _rollouts(k, successes)
    schema.write_table(rnd.collect.rollouts, "rollouts", rows)
    schema.write_table(rnd.collect.turns / "part-00000.parquet", "turns", _turns(rows, 10 + k))
    rnd.collect.manifest.write_text(json.dumps({"policy": rows[0]["policy"], "wall_s": 100.0 + k}))
    write_marker(rnd, "collect", 101.0 + k)
    if not train:
        return
    rnd.convert.root.mkdir(parents=True)
    rnd.convert.stats.write_text(json.dumps({"groups": {"used": 2, "dropped": {"no_signal": 1}},
                                             "rows": {"count": 8}, "prefix_breaks": {"total": k}, "wall_s": 3.0,
                                             "rules": {"length_masked": {"rollouts": 2, "count": 3, "tokens": 40 + k}}}))
    rnd.train.root.mkdir(parents=True)
    steps = [{"step": i + 1, "loss": 0.1 / (i + 1), "clip_low": 0.01, "clip_high": 0.02, "kl": 0.001 * i,
              "entropy": 1.5, "ratio_mean": 1.0, **({"mismatch_mean": 1e-5, "mismatch_max": 1e-4} if i == 0 else {})}
             for i in range(3)]
    rnd.train.metrics.write_text("".join(json.dumps(s) + "\n" for s in steps) + '{"step": 4, "lo')  # a cut line
    for stage in ("convert", "train", "publish"):
        write_marker(rnd, stage, 5.0)


def referenced(page: Path) -> list[str]:
    return re.findall(r"(?:src|href)='([^']+)'", page.read_text())


def test_report_of_two_rounds_references_only_existing_files(tmp_path):
    layout = RunLayout(tmp_path / "run")
    make_round(layout, 0, {"a": 1, "b": 2, "c": 0})
    make_round(layout, 1, {"a": 3, "b": 2, "c": 1})
    page = write_report(layout.root)
    refs = referenced(page)
    assert refs and all((page.parent / r).is_file() for r in refs), refs
    for plot in ("reward", "tasks", "signal", "training", "mismatch", "lengths", "walls"):
        assert f"report/{plot}.png" in refs, plot
    assert "offpolicy" not in page.read_text()  # no replay jobs: no empty frame
    assert "What convert masked or dropped" in page.read_text() and "<td>length_masked</td>" in page.read_text()
    assert "<td>41</td>" in page.read_text()  # round 1's masked loss tokens
    rounds = gather(layout.root)
    assert [r.mean_reward for r in rounds] == [0.25, 0.5]
    assert rounds[0].groups_with_signal == 2 and rounds[1].groups_with_signal == 3
    assert rounds[1].success_by_task == {"a": 0.75, "b": 0.5, "c": 0.25}
    assert rounds[1].response_tokens == 11 and rounds[1].prefix_breaks == 1
    assert len(rounds[0].steps) == 3 and rounds[0].mismatch_mean == 1e-5  # the cut line is skipped
    assert rounds[0].walls == {"collect": 101.0, "convert": 5.0, "train": 5.0, "publish": 5.0}


def test_partial_run_and_stale_plots(tmp_path):
    layout = RunLayout(tmp_path / "run")
    page = write_report(layout.root)  # no rounds at all
    assert "No rounds yet" in page.read_text() and referenced(page) == []
    make_round(layout, 0, {"a": 1}, train=False)  # killed after collect
    (layout.report_assets / "training.png").write_bytes(b"stale")
    page = write_report(layout.root)
    refs = referenced(page)
    assert "report/reward.png" in refs and "report/training.png" not in refs
    assert not (layout.report_assets / "training.png").exists()
    assert all((page.parent / r).is_file() for r in refs)


def test_compare_figure(tmp_path, capsys):
    for name, later in (("learn", 3), ("zero", 1)):
        layout = RunLayout(tmp_path / name)
        make_round(layout, 0, {"a": 1})
        make_round(layout, 1, {"a": later})
    out = tmp_path / "learning.png"
    assert report_main(["--compare", f"grpo={tmp_path / 'learn'}", f"zero={tmp_path / 'zero'}", "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "grpo: mean reward per round 0.250 0.750" in printed and "zero: mean reward per round 0.250 0.250" in printed


def test_experiment_pairs_arms_by_seed(tmp_path, capsys):
    """grpo-s<N> against zero-s<N>: the gap per seed and round, its mean and range, and the
    successes' call counts (a collapse to one-call shortcuts would show as 0/n)."""
    plan = {"grpo-s0": (1, 3), "zero-s0": (1, 1), "grpo-s1": (2, 4), "zero-s1": (2, 3), "grpo-s2": (1, 2)}
    for name, (first, later) in plan.items():
        layout = RunLayout(tmp_path / name)
        make_round(layout, 0, {"a": first})
        make_round(layout, 1, {"a": later})
    out = tmp_path / "multiturn.png"
    args = [f"multiturn-{n}={tmp_path / n}" for n in plan]
    assert report_main(["--compare", *args, "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "seed 0: grpo 0.250 0.750 | zero 0.250 0.250 | grpo - zero 0.000 0.500" in printed
    assert "seed 1: grpo 0.500 1.000 | zero 0.500 0.750 | grpo - zero 0.000 0.250" in printed
    assert "seed 2" not in printed  # no control for seed 2: not paired
    assert "round 1: grpo - zero +0.375 over 2 seed(s) (range +0.250 .. +0.500)" in printed
    assert "successes in >= 2 calls 0/3" in printed  # make_round's rollouts are one call each
    import matplotlib.pyplot as plt

    assert plt.imread(out).shape[1] == 15 * 90  # three panels
    for name, mean in (("grpo-s0", 0.7), ("zero-s0", 0.2)):  # the loops evaluated policy-v1 on a held-out split
        write_marker(RunLayout(tmp_path / name).round(0), "eval", 1.0, policy="policy-v1", k=1, mean=mean, low=mean - 0.1,
                     high=mean + 0.1, base={"mean": 0.2, "low": 0.1, "high": 0.3})
    assert report_main(["--compare", *args, "--out", str(out)]) == 0
    assert plt.imread(out).shape[1] == 20 * 90  # and the held-out reward per round beside them


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium (Debian package) is not installed")
def test_report_opens_in_headless_chromium(tmp_path):
    """The page renders from the file system with nothing else running (a screenshot to look at:
    chromium --headless --screenshot=shot.png --window-size=1150,4200 file://.../report.html)."""
    layout = RunLayout(tmp_path / "run")
    make_round(layout, 0, {"a": 1, "b": 2})
    make_round(layout, 1, {"a": 3, "b": 2})
    page = write_report(layout.root)
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1150,4200", f"--screenshot={shot}", page.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    assert shot.stat().st_size > 50_000  # the plots, not a blank page (a page of text alone: ~23 kB)


# Appended to a copy of the page: where every table's box ends, and whether the page itself is wider
# than the window (the report has no script of its own; this one runs after the layout).
MEASURE = """<script>
const boxes = [...document.querySelectorAll('table')].map(t => {
  const box = t.parentElement, r = box.getBoundingClientRect();
  return {right: r.right, box: box.clientWidth, table: t.scrollWidth, overflow: getComputedStyle(box).overflowX};
});
document.body.insertAdjacentHTML('beforeend', '<pre id="measure">' + JSON.stringify(
  {window: innerWidth, page: document.documentElement.scrollWidth, boxes}) + '</pre>');
</script>"""


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium (Debian package) is not installed")
def test_the_rounds_table_fits_a_1200px_window(tmp_path):
    """The rounds table's 23 columns neither run off the page's right edge nor widen it: the table
    stays in its box, which scrolls sideways when the columns do not fit."""
    layout = RunLayout(tmp_path / "run")
    for k in range(3):
        make_round(layout, k, {"a-long-task-name": 1, "b": 2})
    page = write_report(layout.root)
    probe = page.with_name("measure.html")
    probe.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                          "--no-first-run", "--hide-scrollbars", "--window-size=1200,900", "--dump-dom",
                          probe.resolve().as_uri()], check=True, capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<pre id="measure">(.*?)</pre>', dom)
    assert m, dom[-2000:]
    seen = json.loads(m.group(1).replace("&quot;", '"'))
    assert seen["window"] == 1200 and seen["boxes"], seen
    assert seen["page"] <= seen["window"], f"the page is wider than the window: {seen}"
    for box in seen["boxes"]:
        assert box["right"] <= seen["window"], f"a table's box runs off the right edge: {seen}"
        if box["table"] > box["box"]:  # what does not fit is reachable inside the box
            assert box["overflow"] in ("auto", "scroll"), seen
