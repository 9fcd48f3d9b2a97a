"""A harbor environment on bubblewrap: one isolated sandbox per trial, without Docker.

Load it by import path: `wharf.collect.sandbox.bwrap:BwrapEnvironment`.

The boundary (details in ns.py): each trial runs in a long-lived sandbox with its own user,
pid, mount, IPC, UTS and network namespaces, as an unprivileged host uid of its own, with no
capability; every exec joins it (so daemons such as tmux survive between execs). It sees the
host's system dirs and the agent's install read-only and nothing else of the host: not the
project, the datasets, the runs dir or /root. Its writable dirs (workdir, /tmp, HOME, /logs/agent,
/logs/artifacts, /installed-agent, /solution) are size-limited tmpfs mounts; a pids cgroup bounds
fork bombs. Its only way out is `forward`: each listed loopback address (the rollout's proxy
route) is reachable at the same address inside, through a Unix socket, and nothing else is.

Two phases. The agent phase ends when the verifier uploads the tests (upload_dir to /tests):
every agent process is killed at once (the pid namespace goes), the agent's change to the
workdir is read out and laid over a clean copy of environment/ with test files and test
configuration set aside (changes.py), and the verifier gets a fresh sandbox holding that copy,
the tests, and an empty /logs/verifier. Nothing the agent left anywhere else reaches it. The
agent never sees tests/ or solution/ (the oracle agent uploads its own solution).

Logs are not bind mounts (capabilities.mounted is False): harbor downloads /logs/agent and
/logs/verifier through the sandbox, so a symlink an agent planted resolves inside it.

What it cannot do: build a Dockerfile (tasks ship their files in environment/), switch users
(`user` is ignored), give an agent the internet.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path, PurePosixPath

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import NetworkMode, NetworkPolicy

from wharf.core import envdefaults
from wharf.core.model_store import cache_dir
from wharf.collect.sandbox import changes, rewardproof
from wharf.collect.sandbox.ns import SANDBOX_UID, Sandbox, Spec, minimal_expose
from wharf.collect.sandbox.process import run_process
from wharf.collect.sandbox.relay import Relay, parse_forward
from wharf.collect.sandbox.transfer import copy_selected, extract_safely, tar_of

DEFAULT_WORKDIR = "/app"
HOME = "/home/agent"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TESTS_DIR = "/tests"
AGENT_DIRS = ("/tmp", "/var/tmp", HOME, "/logs/agent", "/logs/artifacts", "/installed-agent", "/solution")
VERIFIER_DIRS = ("/tmp", "/var/tmp", HOME, "/logs/verifier", "/logs/artifacts", TESTS_DIR)
# The verifier runs as this uid, in a sandbox that allows nested user namespaces: the grader
# confines the code under test in namespaces of its own (wharf/tasks/tools/jail.py).
VERIFIER_UID = 1000
TASK_TOOLS = Path(__file__).resolve().parents[2] / "tasks" / "tools"
# The npm-installed agent CLIs (make agents) and the Python ones' venvs (make agents-py), shown
# read-only like the venv when present.
_AGENT_INSTALLS = [str(p) for p in (Path(__file__).resolve().parents[1] / "agents" / "node" / "node_modules",
                                    Path(__file__).resolve().parents[3] / ".venv-agents") if p.is_dir()]
# Fixed paths a harbor agent's own run() calls, each a read-only view of a venv of make agents-py
# (already shown at its real path above); in the agent phase only.
_AGENT_BINDS = {target: os.path.realpath(p) for target, p in (
    ("/opt/openhands-venv", Path(__file__).resolve().parents[3] / ".venv-agents" / "openhands"),) if p.is_dir()}


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


class BwrapEnvironment(BaseEnvironment):
    """kwargs (TrialEnvironmentConfig.kwargs):
    forward     loopback addresses reachable inside, at the same address: "127.0.0.1:8200", or a
                route URL (http://127.0.0.1:8200/rollout/<id>/v1) to let only that route through
    expose      more host paths to show read-only (the agent's install beyond the venv)
    disk_mb     size of each writable tmpfs dir (default 256)
    pids_max    processes at most in the sandbox (default 512)
    git_init    commit the initial workdir as a git repo so agents can diff (default True)
    python      the interpreter exported as WHARF_PYTHON (default: harbor's own, i.e. the venv)
    state_dir   where the host-side dir of each sandbox goes (default: the system temp dir; it
                must be traversable by other uids)
    """

    def __init__(self, *args, forward: list[str] | None = None, expose: list[str] | None = None,
                 disk_mb: int = 256, pids_max: int = 512, git_init: bool = True,
                 python: str | None = None, state_dir: str | None = None, **kwargs):
        self._forward = [parse_forward(f) for f in forward or []]
        self._expose = list(expose or [])
        self._disk = disk_mb << 20
        self._pids_max = pids_max
        self._git_init = git_init
        self._python = _visible_path(python or sys.executable)
        self._state_parent = state_dir
        self._sandbox: Sandbox | None = None
        self._relays: list[Relay] = []
        self._phase = "agent"
        self._reward_key: bytes | None = None
        self._no_network = False
        super().__init__(*args, **kwargs)
        self._no_network = self._network_disabled

    # ---- harbor's contract -------------------------------------------------------------

    @staticmethod
    def type() -> str:
        return "bwrap"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(mounted=False, disable_internet=True, dynamic_network_policy=False)

    @classmethod
    def preflight(cls) -> None:
        if bwrap_path() is None:
            raise SystemExit("bwrap not found: install bubblewrap (apt-get install -y bubblewrap, or make setup)")

    def _validate_definition(self):
        if bwrap_path() is None:
            raise RuntimeError(
                "BwrapEnvironment needs the `bwrap` binary: apt-get install -y bubblewrap (make setup does it)"
            )
        if self.environment_dir.exists() and not self.environment_dir.is_dir():
            raise FileNotFoundError(f"{self.environment_dir}: the task's environment/ must be a directory")

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        self._no_network = network_policy.network_mode == NetworkMode.NO_NETWORK

    @property
    def workdir(self) -> str:
        return self.task_env_config.workdir or DEFAULT_WORKDIR

    @property
    def phase(self) -> str:
        """'agent' until the tests are uploaded, then 'verifier'."""
        return self._phase

    async def start(self, force_build: bool) -> None:
        if (self.environment_dir / "Dockerfile").exists():
            self.logger.warning(
                f"{self.environment_dir}/Dockerfile is not built by the bwrap sandbox: "
                "the task runs on the host's tools with environment/'s files in the workdir"
            )
        await self._open("agent")
        await self._fill_workdir(self._pristine())

    async def stop(self, delete: bool):
        await self._close()

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        rc, out, err = await self._run(["bash", "-c", command], cwd=cwd, env=self._merge_env(env),
                                       timeout_sec=timeout_sec, stream=True)
        return ExecResult(
            stdout=out.decode(errors="replace") if out else None,
            stderr=err.decode(errors="replace") if err else None,
            return_code=rc,
        )

    async def upload_file(self, source_path: Path | str, target_path: str):
        data = Path(source_path).read_bytes()
        target = self._abs(target_path)
        script = f"mkdir -p {shlex.quote(str(target.parent))} && cat > {shlex.quote(str(target))}"
        await self._checked(["sh", "-c", script], f"upload {source_path} -> {target}", stdin=data)

    async def upload_dir(self, source_dir: Path | str, target_dir: str):
        source = Path(source_dir)
        if not source.is_dir():
            raise FileNotFoundError(f"upload_dir: {source} is not a directory")
        entering = self._abs(target_dir) == PurePosixPath(TESTS_DIR) and self._phase == "agent"
        if entering:
            await self._enter_verification()
        await self._untar(tar_of(source), str(self._abs(target_dir)), f"upload {source} -> {target_dir}")
        if entering:  # the reward proof's key, for a grader that takes part (rewardproof.py)
            self._reward_key = rewardproof.new_key()
            await self._checked(["sh", "-c", f"umask 077 && cat > {rewardproof.KEY_FILE}"], "write the reward key",
                                stdin=self._reward_key)

    async def download_file(self, source_path: str, target_path: Path | str):
        data = await self._checked(["cat", "--", str(self._abs(source_path))], f"download {source_path}")
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str):
        grading = self._phase == "verifier" and self._abs(source_dir) == PurePosixPath("/logs/verifier")
        if grading:
            await self._sandbox.freeze()  # nothing the tests started may write once it is read
            rc, key_left, _ = await self._run(["cat", "--", rewardproof.KEY_FILE], cwd="/", timeout_sec=60)
        data = await self._checked(["tar", "-cf", "-", "-C", str(self._abs(source_dir)), "."],
                                   f"download {source_dir}")
        extract_safely(data, Path(target_dir), self.logger, source_dir)
        if grading and self._reward_key is not None:
            why = rewardproof.enforce(Path(target_dir), self._reward_key, key_left if rc == 0 else None)
            if why:
                self.logger.warning(f"{self.session_id}: reward rejected: {why}")

    async def download_dir_filtered(self, *, source_dir: str, target_dir: Path | str, include=None, exclude=None,
                                    protect=None) -> None:
        """harbor's path when a trial filters its logs (include_logs / exclude_logs): the whole dir
        comes down through download_dir, so the reward proof holds here too, then only the
        selected files (and `protect`, and the proof's verdict) are kept."""
        with tempfile.TemporaryDirectory() as tmp:
            await self.download_dir(source_dir, tmp)
            copy_selected(Path(tmp), Path(target_dir), include, exclude, {*(protect or ()), rewardproof.REJECTED})

    # ---- phases ------------------------------------------------------------------------

    async def _open(self, phase: str) -> None:
        self._phase = phase
        dirs = AGENT_DIRS if phase == "agent" else VERIFIER_DIRS
        expose = [sys.prefix, sys.base_prefix, self._python, *_AGENT_INSTALLS, *self._expose, *self._task_envs()]
        if phase == "verifier":
            expose.append(str(TASK_TOOLS))
        forwards: dict[int, str] = {}
        sb = Sandbox(Spec(writable=[self.workdir, *dirs], expose=minimal_expose(expose),
                          binds=dict(_AGENT_BINDS) if phase == "agent" else {},
                          python=os.path.realpath(self._python), tmpfs_bytes=self._disk,
                          pids_max=self._pids_max, forwards=forwards,
                          uid=VERIFIER_UID if phase == "verifier" else SANDBOX_UID,
                          nested_userns=phase == "verifier"), parent=self._state_parent)
        if phase == "agent" and not self._no_network:
            for host, port, prefix in self._forward:
                relay = Relay(sb.dir / "sock" / f"{port}.sock", host, port, prefix)
                await relay.start()
                self._relays.append(relay)
                forwards[port] = str(relay.path)
        self._sandbox = sb
        await sb.start()

    async def _close(self) -> None:
        for relay in self._relays:
            await relay.stop()
        self._relays.clear()
        if self._sandbox is not None:
            await self._sandbox.stop()
            self._sandbox = None

    async def _enter_verification(self) -> None:
        """End the agent phase: kill every agent process, keep only its change to the workdir,
        and give the verifier a fresh sandbox with a clean copy plus that change."""
        sb = self._sandbox
        await sb.freeze()
        data = await self._checked(["tar", "-cf", "-", "--exclude=./.git", "-C", self.workdir, "."],
                                   "read the agent's workdir", pid=False)
        await self._close()
        agent, others = changes.read_tar(data)
        tests = self.environment_dir.parent / "tests"
        test_names = {p.name for p in tests.rglob("*") if p.is_file()} if tests.is_dir() else set()
        merged = changes.merge(self._pristine(), agent, others, test_names)
        if merged.set_aside:
            self.logger.info(f"{self.session_id}: set aside from the agent's change: {merged.set_aside}")
        await self._open("verifier")
        await self._fill_workdir(self._pristine(), then=merged.tree)
        report = json.dumps({"changed": merged.changed, "deleted": merged.deleted, "set_aside": merged.set_aside},
                            indent=1).encode()
        await self._checked(["sh", "-c", "cat > /logs/verifier/agent_change.json"], "write agent_change.json", stdin=report)

    def _task_envs(self) -> list[str]:
        """The package test envs the task names in task.toml's `[metadata] wharf_expose` (made by
        `wharf tasks make`), shown read-only; only envs under the cache's tasks/envs/ are shown."""
        try:
            meta = tomllib.loads((self.environment_dir.parent / "task.toml").read_text()).get("metadata", {})
        except (OSError, tomllib.TOMLDecodeError):
            return []
        envs = os.path.realpath(cache_dir() / "tasks" / "envs") + os.sep
        named = [os.path.realpath(p) for p in meta.get("wharf_expose", []) if isinstance(p, str)]
        refused = [p for p in named if not p.startswith(envs)]
        if refused:
            self.logger.warning(f"{self.session_id}: task.toml wharf_expose outside {envs} not shown: {refused}")
        return [p for p in named if p.startswith(envs) and os.path.isdir(p)]

    def _pristine(self) -> changes.Tree:
        return changes.read_dir(self.environment_dir) if self.environment_dir.is_dir() else {}

    async def _fill_workdir(self, tree: changes.Tree, then: changes.Tree | None = None) -> None:
        """Put `tree` in the workdir and commit it as git's initial state; then, uncommitted,
        replace it with `then` (so `git diff` in the verifier shows the agent's change)."""
        await self._untar(changes.write_tar(tree), self.workdir, "fill the workdir")
        if self._git_init and shutil.which("git"):
            r = await self.exec(
                "[ -d .git ] || { git init -q && git add -A && "
                "git -c user.name=wharf -c user.email=wharf@localhost commit -q --allow-empty -m initial; }",
                cwd=self.workdir, timeout_sec=120)
            if r.return_code != 0:
                raise RuntimeError(f"{self.session_id}: git init of {self.workdir} failed: {r.stderr or r.stdout}")
        if then is not None:
            await self._checked(["find", self.workdir, "-mindepth", "1", "-maxdepth", "1", "!", "-name", ".git",
                                 "-exec", "rm", "-rf", "{}", "+"], "clear the workdir")
            await self._untar(changes.write_tar(then), self.workdir, "lay the agent's change over the workdir")

    # ---- internals ---------------------------------------------------------------------

    def _abs(self, path: str) -> PurePosixPath:
        p = PurePosixPath(path)
        return p if p.is_absolute() else PurePosixPath(self.workdir) / p

    async def _untar(self, data: bytes, target: str, what: str) -> None:
        q = shlex.quote(target)
        await self._checked(["sh", "-c", f"mkdir -p {q} && tar -xpf - -C {q}"], what, stdin=data)

    def _base_env(self) -> dict[str, str]:
        env = {"PATH": DEFAULT_PATH, "HOME": HOME, "USER": "root", "LANG": "C.UTF-8", "TERM": "xterm",
               "TMPDIR": "/tmp", "WHARF_PYTHON": self._python}
        if self._phase == "verifier":  # grading tools (grading.py, testlog.sh), for verifiers only
            env["WHARF_TASK_TOOLS"] = str(TASK_TOOLS)
        env.update({k: os.environ[k] for k in envdefaults.DEFAULTS if k in os.environ})
        return env

    async def _run(self, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: float | None = None, stdin: bytes | None = None, stream: bool = False,
                   pid: bool = True) -> tuple[int, bytes, bytes]:
        if self._sandbox is None:
            raise RuntimeError(f"{self.session_id}: the sandbox is not started (call start() first)")
        full_env = {**self._base_env(), **(env or {})}
        pid = pid and self._sandbox.alive  # a frozen sandbox is read without its pid namespace
        cmd, fds = self._sandbox.join_argv(argv, full_env, cwd or self.workdir, pid=pid)
        return await run_process(cmd, fds, stdin=stdin, timeout_sec=timeout_sec,
                                 on_chunk=self._output_callback() if stream else None)

    async def _checked(self, argv: list[str], what: str, stdin: bytes | None = None, pid: bool = True) -> bytes:
        rc, out, err = await self._run(argv, cwd="/", stdin=stdin, timeout_sec=600, pid=pid)
        if rc != 0:
            raise RuntimeError(f"{self.session_id}: {what} failed (exit {rc}): {err.decode(errors='replace').strip()}")
        return out


def _visible_path(path: str) -> str:
    """path with its dir resolved (the sandbox binds real paths), the file name kept (a venv's
    bin/python must stay the venv's, not the base interpreter it links to)."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
