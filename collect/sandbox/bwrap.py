"""A harbor environment on bubblewrap: a per-trial filesystem without Docker.

Load it by import path: `collect.sandbox.bwrap:BwrapEnvironment`.

Layout. Every trial gets a host state dir whose `root/` is bound as the sandbox's `/`, so
everything written outside the read-only host dirs (workdir, /tests, /solution, /tmp, HOME,
/installed-agent, even `mkdir /foo`) persists from one exec to the next. The host's top-level
dirs (/usr, /etc, /work, /root, ...) are bound on top read-only, one by one: that gives the
agent the host's tools and lets the verifier use the project venv (WHARF_PYTHON), while a
bind of `/` itself would leave no place for new mount points. /logs/{agent,verifier,
artifacts} are binds onto the trial dir (harbor's `mounts`), so logs need no download.

Each exec is a fresh `bwrap` process sharing the host's network (the agent must reach the
recording proxy on 127.0.0.1) and its pid namespace: agents keep daemons (tmux) alive across
execs, which --unshare-pid/--die-with-parent would kill. So every process started here carries
WHARF_SANDBOX_ID in its environment, and stop() kills whatever still carries it.

Not a security boundary against a hostile agent: it runs as the invoking user, sees the host's
files read-only and the network. Transfers go through the sandbox (tar over a pipe) so a
symlink an agent planted resolves inside the sandbox, never on the host.

What it cannot do: build a Dockerfile (tasks ship their files in environment/, copied into the
workdir), switch users (`user` is accepted and ignored), limit CPU or memory.
"""
from __future__ import annotations

import asyncio
import io
import os
import shlex
import shutil
import signal
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path, PurePosixPath

from harbor.environments.base import BaseEnvironment, ExecResult, transfer_tar_filter
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import NetworkMode, NetworkPolicy

from collect import envdefaults

DEFAULT_WORKDIR = "/app"
HOME = "/home/agent"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MARKER = "WHARF_SANDBOX_ID"
# Host top-level entries never bound: kernel filesystems get fresh instances, and /tmp and
# /home belong to the sandbox.
_NEVER_BIND = {"proc", "dev", "sys", "tmp", "home", "lost+found"}
# Sandbox-owned top-level dirs, created in the sandbox root; a host dir of the same name is hidden.
_OWN_DIRS = ("tests", "solution", "installed-agent", "logs", "tmp", "home")
# Files of a docker build spec: we cannot build them, and they do not belong in the workdir.
_BUILD_FILES = {"Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"}


class SandboxTimeoutError(RuntimeError):
    """An exec ran past its timeout (a RuntimeError, as harbor's docker environment raises)."""


TASK_TOOLS = Path(__file__).resolve().parents[1] / "tasks"


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


class BwrapEnvironment(BaseEnvironment):
    """kwargs (TrialEnvironmentConfig.kwargs):
    state_dir   where per-trial state dirs go (default: the system temp dir)
    hide        host top-level dirs not to expose, e.g. ["mnt", "srv"]
    git_init    commit the initial workdir as a git repo so agents/graders can diff (default True)
    python      the interpreter exported as WHARF_PYTHON (default: harbor's own, i.e. the venv)
    """

    def __init__(
        self,
        *args,
        state_dir: str | None = None,
        hide: list[str] | None = None,
        git_init: bool = True,
        python: str | None = None,
        **kwargs,
    ):
        self._state_parent = Path(state_dir or tempfile.gettempdir())
        self._hide = set(hide or [])
        self._git_init = git_init
        self._python = python or sys.executable
        self._id = uuid.uuid4().hex
        self._state: Path | None = None
        self._no_network = False
        super().__init__(*args, **kwargs)
        self._no_network = self._network_disabled

    # ---- harbor's contract -------------------------------------------------------------

    @staticmethod
    def type() -> str:
        return "bwrap"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # Each exec is a new bwrap process, so a network policy can change between any two.
        return EnvironmentCapabilities(mounted=True, disable_internet=True, dynamic_network_policy=True)

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
    def state_dir(self) -> Path:
        if self._state is None:
            raise RuntimeError(f"{self.session_id}: the sandbox is not started (call start() first)")
        return self._state

    async def start(self, force_build: bool) -> None:
        self._state_parent.mkdir(parents=True, exist_ok=True)
        self._state = Path(tempfile.mkdtemp(prefix=f"wharf-bwrap-{self.environment_name[:40]}-", dir=self._state_parent))
        root = self._state / "root"
        for d in (*_OWN_DIRS, HOME.lstrip("/"), self.workdir.lstrip("/")):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "tmp").chmod(0o1777)
        for name in self._host_entries():
            if os.path.islink(f"/{name}"):  # merged-/usr links such as /bin -> usr/bin
                os.symlink(os.readlink(f"/{name}"), root / name)
        for mount in self._mounts:
            Path(mount["source"]).mkdir(parents=True, exist_ok=True)
        if (self.environment_dir / "Dockerfile").exists():
            self.logger.warning(
                f"{self.environment_dir}/Dockerfile is not built by the bwrap sandbox: "
                "the task runs on the host's tools with environment/'s files in the workdir"
            )
        if self.environment_dir.is_dir():
            # Fresh dir, nothing an agent planted yet: a host-side copy is safe here.
            shutil.copytree(
                self.environment_dir,
                root / self.workdir.lstrip("/"),
                symlinks=True,
                dirs_exist_ok=True,
                ignore=lambda _d, names: [n for n in names if n in _BUILD_FILES],
            )
        if self._git_init and shutil.which("git"):
            r = await self.exec(
                "[ -d .git ] || { git init -q && git add -A && "
                "git -c user.name=wharf -c user.email=wharf@localhost commit -q --allow-empty -m initial; }",
                cwd=self.workdir,
                timeout_sec=120,
            )
            if r.return_code != 0:
                raise RuntimeError(f"{self.session_id}: git init of {self.workdir} failed: {r.stderr or r.stdout}")

    async def stop(self, delete: bool):
        killed = await asyncio.to_thread(self._kill_leftovers)
        if killed:
            self.logger.debug(f"{self.session_id}: killed {killed} leftover process(es)")
        if delete and self._state is not None:
            await asyncio.to_thread(shutil.rmtree, self._state, True)
            self._state = None

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        rc, out, err = await self._run(
            ["bash", "-c", command], cwd=cwd, env=self._merge_env(env), timeout_sec=timeout_sec, stream=True
        )
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
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for child in sorted(source.iterdir()):
                tf.add(child, arcname=child.name)
        target = shlex.quote(str(self._abs(target_dir)))
        await self._checked(
            ["sh", "-c", f"mkdir -p {target} && tar -xpf - -C {target}"],
            f"upload {source} -> {target_dir}",
            stdin=buf.getvalue(),
        )

    async def download_file(self, source_path: str, target_path: Path | str):
        data = await self._checked(["cat", "--", str(self._abs(source_path))], f"download {source_path}")
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str):
        data = await self._checked(
            ["tar", "-cf", "-", "-C", str(self._abs(source_dir)), "."], f"download {source_dir}"
        )
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        skipped: list[str] = []

        def safe(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
            # One link pointing outside (e.g. to /tests/x) must not lose the whole directory.
            try:
                return transfer_tar_filter(member, dest)
            except tarfile.FilterError:
                skipped.append(member.name)
                return None

        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            tf.extractall(path=target, filter=safe)
        if skipped:
            self.logger.warning(f"download {source_dir}: skipped links/paths leaving the dir: {skipped[:10]}")

    # ---- internals ---------------------------------------------------------------------

    def _abs(self, path: str) -> PurePosixPath:
        p = PurePosixPath(path)
        return p if p.is_absolute() else PurePosixPath(self.workdir) / p

    def _host_entries(self) -> list[str]:
        hidden = _NEVER_BIND | set(_OWN_DIRS) | self._hide | {PurePosixPath(self.workdir).parts[1]}
        hidden |= {PurePosixPath(m["target"]).parts[1] for m in self._mounts if m.get("target")}
        return sorted(n for n in os.listdir("/") if n not in hidden)

    def _project_paths(self) -> list[str]:
        bound = set(self._host_entries())
        paths = {os.path.realpath(p) for p in (TASK_TOOLS.parents[1], sys.prefix, Path(self._python).parent.parent)}
        paths = {p for p in paths if PurePosixPath(p).parts[1] not in bound}
        # a path inside another one comes with it
        return sorted(p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths))

    def _bwrap_args(self, cwd: str) -> list[str]:
        args = [bwrap_path() or "bwrap", "--bind", str(self.state_dir / "root"), "/"]
        for name in self._host_entries():
            host = f"/{name}"
            if os.path.islink(host):
                continue  # made once in start(): the root persists, and bwrap refuses an existing link
            if os.path.isdir(host) or os.path.isfile(host):
                args += ["--ro-bind", host, host]
        args += ["--proc", "/proc", "--dev", "/dev", "--ro-bind-try", "/sys", "/sys"]
        # The project and its venv must be visible (WHARF_PYTHON, WHARF_TASK_TOOLS, the mini CLI)
        # even when they live under a top-level dir the sandbox owns, e.g. a clone in /tmp.
        for path in self._project_paths():
            args += ["--ro-bind", path, path]
        for mount in self._mounts:
            if mount.get("type", "bind") != "bind" or not mount.get("source") or not mount.get("target"):
                continue
            flag = "--ro-bind" if mount.get("read_only") else "--bind"
            args += [flag, str(mount["source"]), str(mount["target"])]
        if self._no_network:
            args.append("--unshare-net")
        return args + ["--chdir", cwd, "--"]

    def _base_env(self) -> dict[str, str]:
        env = {
            "PATH": DEFAULT_PATH,
            "HOME": HOME,
            "USER": "root",
            "LANG": "C.UTF-8",
            "TERM": "xterm",
            "TMPDIR": "/tmp",
            # The project venv (swebench, pytest) for verifiers that grade with it, and our
            # grading tools (grading.py, testlog.sh), so task dirs need not carry copies.
            "WHARF_PYTHON": self._python,
            "WHARF_TASK_TOOLS": str(TASK_TOOLS),
        }
        for key in envdefaults.DEFAULTS:
            if key in os.environ:
                env[key] = os.environ[key]
        return env

    async def _run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: float | None = None,
        stdin: bytes | None = None,
        stream: bool = False,
    ) -> tuple[int, bytes, bytes]:
        full_env = {**self._base_env(), **(env or {}), MARKER: self._id}
        proc = await asyncio.create_subprocess_exec(
            *self._bwrap_args(cwd or self.workdir),
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=full_env,
            start_new_session=True,  # one process group to kill on timeout or cancel
        )
        callback = self._output_callback() if stream else None
        chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}

        async def pump(reader: asyncio.StreamReader, name: str) -> None:
            while chunk := await reader.read(65536):
                chunks[name].append(chunk)
                if callback is not None:
                    await callback(chunk.decode(errors="replace"), name)

        async def feed() -> None:
            if stdin is not None:
                try:
                    proc.stdin.write(stdin)
                    await proc.stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    proc.stdin.close()

        async def run_all() -> int:
            await asyncio.gather(feed(), pump(proc.stdout, "stdout"), pump(proc.stderr, "stderr"))
            return await proc.wait()

        try:
            rc = await asyncio.wait_for(run_all(), timeout=timeout_sec) if timeout_sec else await run_all()
        except asyncio.TimeoutError:
            await self._kill_group(proc)
            raise SandboxTimeoutError(f"Command timed out after {timeout_sec} seconds") from None
        except BaseException:
            await self._kill_group(proc)
            raise
        return rc, b"".join(chunks["stdout"]), b"".join(chunks["stderr"])

    async def _checked(self, argv: list[str], what: str, stdin: bytes | None = None) -> bytes:
        rc, out, err = await self._run(argv, cwd="/", stdin=stdin, timeout_sec=600)
        if rc != 0:
            raise RuntimeError(f"{self.session_id}: {what} failed (exit {rc}): {err.decode(errors='replace').strip()}")
        return out

    @staticmethod
    async def _kill_group(proc: asyncio.subprocess.Process) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            await asyncio.wait_for(proc.wait(), timeout=10)
        except asyncio.TimeoutError:
            pass

    def _kill_leftovers(self) -> int:
        """SIGKILL every process whose environment carries this sandbox's id, until none is left."""
        needle = f"{MARKER}={self._id}".encode()
        killed = 0
        for _ in range(20):
            found = [pid for pid in _pids() if _has_env(pid, needle)]
            if not found:
                break
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.05)  # let the kernel tear them down before looking again
        return killed


def _pids() -> list[int]:
    me = os.getpid()
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != me]


def _has_env(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False
