"""The run report on a run dir written the way the stages write theirs (real parquet through
wharf.schema, convert's stats.json, train's metrics.jsonl, the loop's markers): every plot with
data is drawn, the page references only files that exist, and a partial run still gets a page."""
from __future__ import annotations

import datetime as dt
import html
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
    assert "report/tasks.png" in refs and "report/training.png" not in refs  # one round: no step trained
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


CHAT = [  # a two-call rollout as the minimal agent's chat requests and the endpoint's answers
    ({"messages": [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix {task}."}]},
     {"choices": [{"message": {"role": "assistant", "content": "",
                               "tool_calls": [{"function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]}}]}),
    ({"messages": [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix {task}."},
                   {"role": "assistant", "content": "calling bash"}, {"role": "tool", "content": "README <b>"}]},
     {"choices": [{"message": {"role": "assistant", "content": "Done with {task}, attempt {a}."}}]}),
]


def chat_turns(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        for turn, (req, resp) in enumerate(CHAT):
            fill = lambda x: json.loads(json.dumps(x).replace("{task}", r["task_id"]).replace("{a}", str(r["attempt"])))  # noqa: E731
            out.append({**_turns([r], 3)[0], "turn": turn, "request": json.dumps(fill(req)),
                        "response": json.dumps(fill(resp))})
    return out


def chat_round(layout: RunLayout, successes: dict[str, int]) -> None:
    """Round 0 as `make demo` leaves it (collect only), its rollouts two chat calls each."""
    make_round(layout, 0, successes, train=False)
    rows = _rollouts(0, successes)
    schema.write_table(layout.round(0).collect.turns / "part-00000.parquet", "turns", chat_turns(rows))


def test_one_round_shows_what_the_round_holds(tmp_path):
    """A run of one collect round (the demo): its tasks, answer lengths and stage time, no curve of
    a single point, and the page says what needs more rounds."""
    import matplotlib.pyplot as plt

    from wharf.pipeline.report import plots

    layout = RunLayout(tmp_path / "run")
    chat_round(layout, {"a": 1, "b": 4, "c": 0})
    page = write_report(layout.root)
    refs, text = referenced(page), page.read_text()
    assert refs == ["report/tasks.png", "report/lengths.png", "report/walls.png"]
    assert "One round so far" in text and "drawn from the second round on" in text
    assert "Not drawn yet (no data): Loss, KL, clip fraction, entropy per step." in text
    fig = plt.figure()
    assert plots.reward(gather(layout.root), fig)  # the curve plot, were it drawn: round 0's slot, not ±0.04
    assert fig.axes[0].get_xlim() == (-0.5, 0.5)
    plt.close(fig)
    # the loop evaluated policy-v1 after it: the base (at 0) and policy-v1 (at 1) beside the training reward
    write_marker(layout.round(0), "eval", 1.0, policy="policy-v1", k=1, mean=0.6, low=0.5, high=0.7,
                 base={"mean": 0.2, "low": 0.1, "high": 0.3})
    assert referenced(write_report(layout.root))[0] == "report/reward.png"
    fig = plt.figure()
    assert plots.reward(gather(layout.root), fig) and fig.axes[0].get_xlim() == (-0.5, 1.5)
    plt.close(fig)


def test_samples_show_the_best_and_worst_of_a_group_call_by_call(tmp_path):
    layout = RunLayout(tmp_path / "run")
    chat_round(layout, {"a": 1, "b": 4, "c": 0})
    text = write_report(layout.root).read_text()
    samples = text[text.index("<section id='samples'>"):]
    # group a has a success and failures: first; b and c (all equal) after it; two groups shown
    assert "best of group job0.a: attempt 0, reward 1 (the group's: 1, 0, 0, 0)" in samples
    assert "worst of group job0.a: attempt 3, reward 0" in samples
    assert "best of group job0.b: attempt 0" in samples and "job0.c" not in samples
    assert samples.count("<details class='sample'") == 4  # best and worst of a and of b
    assert samples.count("<div class='call'>") == 8  # 2 calls each
    assert "[tool call] bash({&quot;cmd&quot;: &quot;ls&quot;})" in samples
    assert "README &lt;b&gt;" in samples and "Done with a, attempt 3." in samples
    # call 1 shows only what it added (the tool's output), not the system prompt again
    call1 = samples.split("<b>call 1,")[1].split("<div class='call'>")[0]
    assert "You are an agent." not in call1 and "README" in call1


def test_a_sample_that_met_upstream_errors_says_how_many(tmp_path):
    """A replica that lost the policy fails the agent's calls: the trial is an infra_error, and its
    sample names the call errors the proxy counted (rollouts.n_errors)."""
    layout = RunLayout(tmp_path / "run")
    make_round(layout, 0, {"a": 1}, train=False)
    rows = _rollouts(0, {"a": 1})
    rows[-1].update(status="infra_error", reward=None, n_errors=3)
    schema.write_table(layout.round(0).collect.rollouts, "rollouts", rows)
    schema.write_table(layout.round(0).collect.turns / "part-00000.parquet", "turns", chat_turns(rows))
    samples = write_report(layout.root).read_text().split("<section id='samples'>")[1]
    assert "worst of group job0.a: attempt 3, reward none" in samples
    assert "status infra_error, 3 upstream call error(s)" in samples


def test_config_section_redacts_credentials(tmp_path):
    from wharf.core.config import load_config
    from wharf.core.configio import dump_whole

    layout = RunLayout(tmp_path / "run")
    make_round(layout, 0, {"a": 1}, train=False)
    # written whole, as a run from before recorded configs were redacted left it
    dump_whole(load_config(None, ["endpoint.api_key=sk-do-not-show", "train.lr=0.0003",
                                  "collect.agent_env={HF_TOKEN: hf-do-not-show}"]), layout.config)
    text = write_report(layout.root).read_text()
    config = text[text.index("<section id='config'>"):]
    assert "lr: 0.0003" in config and "api_key: &lt;redacted&gt;" in config and "HF_TOKEN: &lt;redacted&gt;" in config
    assert "do-not-show" not in text


# Appended to a copy of the page: which sections and plots the browser laid out, and whether every
# image loaded (the report itself has no script).
PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images].map(i => ({src: i.getAttribute('src'), w: i.naturalWidth}));
  const ids = [...document.querySelectorAll('section[id], figure[id]')].map(e => e.id);
  document.body.insertAdjacentHTML('beforeend', '<pre id="probe">' + JSON.stringify({ids, imgs}) + '</pre>');
});
</script>"""


def chromium_dom(page: Path, width: int = 1200) -> str:
    return subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--no-first-run", "--hide-scrollbars", f"--window-size={width},900",
                           "--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri()],
                          check=True, capture_output=True, text=True, timeout=120).stdout


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium (Debian package) is not installed")
@pytest.mark.parametrize("rounds", [1, 2])
def test_report_renders_in_headless_chromium(tmp_path, rounds):
    """The page from the file system with nothing else running: every section laid out, every plot
    loaded (a screenshot to look at: chromium --headless --screenshot=shot.png --window-size=1150,4200
    file://.../report.html)."""
    from wharf.core.config import dump_config, load_config

    layout = RunLayout(tmp_path / "run")
    chat_round(layout, {"a": 1, "b": 2})
    if rounds == 2:
        make_round(layout, 1, {"a": 3, "b": 2})
        schema.write_table(layout.round(1).collect.turns / "part-00000.parquet", "turns",
                           chat_turns(_rollouts(1, {"a": 3, "b": 2})))
    dump_config(load_config(None, []), layout.config)
    page = write_report(layout.root)
    assert "<script" not in page.read_text()
    probe = page.with_name("probe.html")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium_dom(probe)
    found = re.findall(r'<pre id="probe">(.*?)</pre>', dom)  # the last: the first is the script's own text
    assert found, dom[-2000:]
    seen = json.loads(html.unescape(found[-1]))
    plots = ["plot-tasks", "plot-lengths", "plot-walls"] if rounds == 1 else [
        "plot-reward", "plot-tasks", "plot-signal", "plot-training", "plot-mismatch", "plot-lengths", "plot-walls"]
    assert seen["ids"] == ["rounds", "plots", *plots, "samples", "config"], seen["ids"]
    assert seen["imgs"] and all(i["w"] > 0 for i in seen["imgs"]), seen["imgs"]  # every plot loaded


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
