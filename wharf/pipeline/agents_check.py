"""The agent matrix: one real harbor trial per agent through the recording proxy, in the default
sandbox, and for each whether it ran, how many calls it made, whether the recorded rows match the
agent's own log one for one (wharf/collect/agents/logs.py), and the bytes of its system prompt and tools
(of its largest call).

Upstream: the local engine (SmolLM2-135M, CPU) for agents whose prompt fits its context, the
vLLM-shaped stub otherwise (scripted: one call of the agent's shell tool, then a final answer).
Agents harbor installs from the internet are tried as they are; their row says why they fail here.

`wharf agents-check [--only a,b] [--engine-port N] [--proxy-port N] [--out DIR]`
(`make agents-check`); exit code 1 when an agent we ship (minimal, mini-swe-agent, terminus-2,
claude-code, codex, opencode, qwen-code, aider, vibe, gemini-cli, openhands) does not run cleanly.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from wharf.collect.agents.logs import compare, read_agent_log
from wharf.collect.runner import Round
from wharf.convert.reader import ConvertInputError, read_job
from wharf.convert.rows import RowError, RowOptions, build_rows
from wharf.engine.launch import launch
from wharf.core import schema
from wharf.core.config import dump_config, load_config
from wharf.core.entry import ArgParser, guarded
from wharf.core.errors import UsageError, WharfError
from wharf.core.ports import check_bindable

REPO = Path(__file__).resolve().parents[2]


class CheckoutMissing(WharfError):
    """agents-check needs files of a wharf checkout that the installed package leaves out."""


def stub_server(root: Path | None = None):
    """The scripted upstream's class (testing/vllm_stub.py). It ships with the checkout, not the
    wheel (test doubles stay out of it), like the task and the pinned agent CLIs this command also
    needs; an installed wharf (`make setup`: editable) finds it beside its own sources."""
    root = root or REPO
    if not (root / "testing" / "vllm_stub.py").is_file() or not (root / "datasets" / "toy").is_dir():
        raise CheckoutMissing(f"needs a wharf checkout (testing/vllm_stub.py, datasets/toy and the pinned agent "
                              f"CLIs), and {root} is not one: run it from a clone, `make setup agents agents-py` "
                              "then `wharf agents-check`")
    if str(root) not in sys.path:
        sys.path.append(str(root))  # last: never shadows an installed module
    from testing.vllm_stub import StubServer

    return StubServer
TASK = "write-hello"  # datasets/toy: the instruction spells out the command
STUB_COMMAND = "echo hello > hello.txt"


@dataclass(frozen=True)
class Agent:
    name: str
    ref: str  # harbor agent name or import path
    upstream: str  # engine | stub
    kwargs: dict = field(default_factory=dict)
    shipped: bool = True  # made to work offline here; a failure fails the check
    why: str = ""  # an agent not shipped: what running it here would take


AGENTS = [
    Agent("minimal", "wharf.collect.agents.minimal:MinimalAgent", "engine", {"max_turns": 3}),
    Agent("mini-swe-agent", "wharf.collect.agents.mini_swe:LocalMiniSweAgent", "engine", {"step_limit": 2}),
    # On the engine, its 256-token answers come back cut off and re-asked for minutes on this CPU.
    Agent("terminus-2", "terminus-2", "stub", {"max_episodes": 2}),
    Agent("claude-code", "wharf.collect.agents.claude_code:LocalClaudeCode", "stub"),
    Agent("codex", "wharf.collect.agents.codex:LocalCodex", "stub"),
    Agent("opencode", "wharf.collect.agents.opencode:LocalOpenCode", "stub"),
    Agent("qwen-code", "wharf.collect.agents.qwen_code:LocalQwenCode", "stub"),
    Agent("aider", "wharf.collect.agents.aider:LocalAider", "stub"),
    Agent("vibe", "wharf.collect.agents.vibe:LocalVibe", "stub"),
    Agent("gemini-cli", "wharf.collect.agents.gemini_cli:LocalGeminiCli", "stub"),
    # Its headless run re-asks after each answer without a tool call until max_iterations.
    Agent("openhands", "wharf.collect.agents.openhands:LocalOpenHands", "stub", {"max_iterations": 2}),
    # harbor's own installers (they download the agent): tried as they are; `why` says what a row
    # of ours would take beyond the install.
    Agent("goose", "goose", "stub", shipped=False, why="a release binary (no registry here serves it)"),
    Agent("swe-agent", "swe-agent", "stub", shipped=False, why="installed from its git repository"),
]


def prompt_bytes(row: dict) -> tuple[int, int]:
    """(system prompt, tools) bytes of a call as the agent sent it, in whichever API."""
    req = json.loads(row["request"])
    api = row["api"]
    system: list[str] = []

    def text(c) -> str:
        if isinstance(c, str):
            return c
        return "".join(p.get("text", "") for p in c or () if isinstance(p, dict))

    if api == "anthropic":
        system.append(text(req.get("system")))
        system += [text(m.get("content")) for m in req.get("messages") or () if m.get("role") == "system"]
    elif api == "gemini":
        si = req.get("systemInstruction") or req.get("system_instruction")
        system.append(si if isinstance(si, str) else text((si or {}).get("parts")))
    elif api == "responses":
        system.append(req.get("instructions") or "")
        items = req.get("input") if isinstance(req.get("input"), list) else []
        system += [text(m.get("content")) for m in items if m.get("role") in ("system", "developer")]
    else:
        system += [text(m.get("content")) for m in req.get("messages") or () if m.get("role") in ("system", "developer")]
    tools = req.get("tools")
    return len("".join(system).encode()), len(json.dumps(tools).encode()) if tools else 0


_TELLING = re.compile(r"curl: \(\d+\).*|Could not resolve host.*|[Ee]rror:.*|.*not found.*|No such file.*")


def why(trial_dir: Path, error: str | None) -> str:
    """A failed trial's reason in one line: the telling line of its exception, and where it failed."""
    if not error:
        return ""
    exc = trial_dir / "exception.txt"
    text = exc.read_text(errors="replace") if exc.is_file() else error
    where = "install" if "in install" in text or "in setup" in text else "run"
    host = re.search(r"Could not resolve host: (\S+)", text)
    if host:
        return f"{where} downloads from {host.group(1)} (no internet here)"
    lines = [m.group(0).strip() for m in _TELLING.finditer(text)]
    return f"{where}: {(lines[-1] if lines else error.splitlines()[0])[:200]}"


def converts(calls: list) -> str:
    """What convert makes of a rollout's ok calls (convert.rows.Call, in turn order): training rows
    and prefix breaks (a call whose prompt does not extend the row so far starts a new row)."""
    try:
        # No truncation and no masking (a call cut at max_tokens would leave its row untrained and
        # uncounted): the split is the question.
        built = build_rows(calls, RowOptions(max_seq_len=1 << 30, length_completions="keep", context_exceeded="keep"))
    except RowError as e:
        return f"refused: {e}"
    n = len(calls) - len(built.duplicates)
    return f"{n} -> {len(built.rows)} row{'s' * (len(built.rows) != 1)}, {len(built.breaks)} break{'s' * (len(built.breaks) != 1)}"


def _converts(collect_dir: Path, rollout_id: str) -> str:
    try:
        job = read_job(collect_dir)
    except ConvertInputError as e:
        return f"refused: {e}"
    return converts(job.calls.get(rollout_id, (0, []))[1])


@dataclass
class Result:
    agent: Agent
    status: str = "-"
    calls: int = 0
    match: str = "-"
    system: int = 0
    tools: int = 0
    converts: str = "-"  # calls -> training rows, prefix breaks
    note: str = ""

    @property
    def ran(self) -> bool:
        return self.calls > 0 and self.status in ("ok", "agent_timeout", "context_exceeded") and self.match == "yes"


def run_one(agent: Agent, upstream: tuple[str, str | None], proxy_port: int, out: Path) -> Result:
    res = Result(agent)
    upstream_url, api_key = upstream
    cfg = load_config(None, [
        f"runs_dir={out}", f"name={agent.name}", f"endpoint.url={upstream_url}", "endpoint.launch=false",
        f"proxy.port={proxy_port}", f"collect.dataset={REPO / 'datasets' / 'toy'}", f"collect.tasks=[{TASK}]",
        f"collect.agent={agent.ref}", "collect.attempts=1", "collect.concurrency=1", "sampling.max_tokens=256",
        "sampling.seed=0", "collect.agent_timeout_s=900", f"collect.agent_kwargs={json.dumps(agent.kwargs)}",
        *([] if agent.upstream == "stub" else ["endpoint.model=smollm2-135m"]),
        *([f"endpoint.api_key={api_key}"] if api_key else []),
    ])
    cfg_path = out / f"{agent.name}.yaml"
    dump_config(cfg, cfg_path)
    try:
        asyncio.run(Round(cfg, cfg_path).run(progress=False))
    except Exception as e:  # noqa: BLE001 - a row of the matrix, not a crash of the check
        res.note = f"{type(e).__name__}: {e}"[:300]
        return res
    paths = cfg.round_layout.collect
    (rollout,) = schema.read_table(paths.rollouts, "rollouts").to_pylist()
    rows = sorted(schema.read_dir(paths.turns, "turns").to_pylist(), key=lambda r: r["turn"]) \
        if schema.shard_files(paths.turns) else []
    res.status, res.calls = rollout["status"], len(rows)
    cdir = paths.root
    res.note = "; ".join(n for n in (why(cdir / rollout["trial_dir"], rollout["error"]), agent.why) if n)
    if rows:  # the largest call's (a side call, e.g. opencode's title, may come first)
        res.system, res.tools = max((prompt_bytes(r) for r in rows), key=sum)
        res.converts = _converts(cdir, rollout["rollout_id"])
    log = read_agent_log(cdir / rollout["trial_dir"] / "agent")
    if log is None:
        res.match = "no log"
    else:
        problems = compare(rows, log, rollout["rollout_id"])
        res.match = "yes" if not problems else "NO"
        if problems:
            res.note = "; ".join(problems)[:300]
    return res


def table(results: list[Result]) -> str:
    head = ("| agent | upstream | ran | status | calls | rows = agent log | converts: calls -> rows, breaks "
            "| system prompt B | tools B | note |")
    lines = [head, "|" + "---|" * 10]
    for r in results:
        lines.append(f"| {r.agent.name} | {r.agent.upstream} | {'yes' if r.ran else 'no'} | {r.status} | {r.calls} | "
                     f"{r.match} | {r.converts} | {r.system:,} | {r.tools:,} | {' '.join(r.note.replace('|', '/').split())} |")
    return "\n".join(lines)


@contextlib.contextmanager
def upstreams(engine_port: int, need_engine: bool, log_dir: Path):
    """{engine, stub}: (base URL, API key) of the local engine (started when needed, with a key of
    its own) and of the scripted stub."""
    with stub_server()(script=f"shell:{STUB_COMMAND}", max_model_len=131072, model="smollm2-135m") as stub:
        if not need_engine:
            yield {"stub": (stub.url, None)}
            return
        cfg = load_config(REPO / "configs" / "default.yaml", [f"endpoint.url=http://127.0.0.1:{engine_port}",
                                                               "engine.max_model_len=8192"])
        with launch(cfg, log_dir=log_dir) as ep:
            yield {"stub": (stub.url, None), "engine": (cfg.endpoint.url, ep.api_key)}


def main(argv: list[str] | None = None, prog: str = "wharf agents-check") -> int:
    p = ArgParser(prog=prog, description=(
        "The agent matrix: one real harbor trial per agent through the recording proxy, and for each whether it "
        "ran, its calls, whether the recorded rows match the agent's own log, and the size of its prompt and "
        "tools. Exit code 1 when an agent wharf ships does not run cleanly."))
    p.add_argument("--only", default="", help=f"comma-separated agent names (default: all: {', '.join(a.name for a in AGENTS)})")
    p.add_argument("--engine-port", type=int, default=8110)
    p.add_argument("--proxy-port", type=int, default=8210)
    p.add_argument("--out", default=None, help="where the trials go (default: a temp dir)")
    args = p.parse_args(argv)
    return guarded(prog, lambda: check(args))


def chosen(only: str) -> list:
    """The agents `--only` names (all when empty); an unknown name is refused, naming the known ones."""
    names = [a for a in only.split(",") if a]
    unknown = [n for n in names if n not in {a.name for a in AGENTS}]
    if unknown:
        raise UsageError(f"--only: no agent named {', '.join(unknown)}; known: {', '.join(a.name for a in AGENTS)}")
    return [a for a in AGENTS if not names or a.name in names]


def check(args: argparse.Namespace) -> int:
    agents = chosen(args.only)
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out}: is a file, not a directory")
    stub_server()  # before any trial: no checkout, one line saying how to get one
    check_bindable("127.0.0.1", args.proxy_port, "--proxy-port")  # each trial's proxy listens there
    out = Path(args.out or tempfile.mkdtemp(prefix="wharf-agents-check-"))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with upstreams(args.engine_port, any(a.upstream == "engine" for a in agents), out) as urls:
        for a in agents:
            print(f"-- {a.name} ({a.upstream})", file=sys.stderr, flush=True)
            results.append(run_one(a, urls[a.upstream], args.proxy_port, out))
            print(table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(results))
    print(f"\ntrials under {out}")
    return 0 if all(r.ran for r in results if r.agent.shipped) else 1
