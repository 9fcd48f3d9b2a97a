"""One long-lived sandbox: a bwrap'd init in fresh namespaces, joined by every exec with nsenter.

The init (init.py, pid 1 of its own pid namespace) lives as long as the sandbox, so daemons an
agent starts (tmux) survive from one exec to the next, and a SIGKILL of the init ends every
process in the sandbox at once (the kernel tears the pid namespace down).

Boundary, per sandbox:
  * user namespace: the sandbox's uid 1000 is an unprivileged host uid of its own (when the
    harbor process runs as root; otherwise the invoking user), every capability dropped, no
    new privileges, no nested user namespaces;
  * pid, ipc, uts and network namespaces of its own: no host process is visible (so none can
    be signalled, traced or read through /proc), the only interface is loopback;
  * mount namespace on an empty tmpfs root made read-only: the host's system dirs and the
    agent's install bound read-only, the writable dirs are size-limited tmpfs mounts (a full
    disk stays inside the sandbox's memory budget), nothing else of the host is there;
  * a pids cgroup (when one can be made) bounds fork bombs.
The mount, user and network namespaces are held by fds, so after the init is killed the files
can still be read out (freeze(), then run(..., pid=False)) with no agent process left.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import secrets
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX_UID = 0  # root in its own user namespace, with no capability (empty bounding set)
NS_GET_PARENT = 0xB702  # ioctl: the user namespace that owns this one
INIT_SOURCE = (Path(__file__).parent / "init.py").read_text()
# Host top-level dirs that make a system: bound read-only when they exist.
SYSTEM_DIRS = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt")
_NS = ("user", "mnt", "pid", "net", "ipc", "uts")
# How long the init may take to answer. A bwrap that dies answers at once (EOF); this bounds a hang
# only, so it is generous: a Ray worker runs niced (15) and, on a busy 2-core host, its sandbox took
# over 30 s to start. harbor's own environment start timeout still bounds the whole start.
START_TIMEOUT_S = 300.0
# In the sandbox: no capability now or after any execve, no setuid gains.
_DROP = ["setpriv", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
_CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")


class SandboxStartError(RuntimeError):
    """The sandbox's init never answered: the host's failure, not the agent's (an infra_error)."""


@dataclass
class Spec:
    """What a sandbox holds. Paths are sandbox paths unless named host."""

    writable: list[str]  # size-limited tmpfs dirs
    expose: list[str] = field(default_factory=list)  # host paths bound read-only at the same path
    # sandbox path -> host path, bound read-only: a fixed path an agent's own run() calls
    # (directly in a system dir or outside them)
    binds: dict[str, str] = field(default_factory=dict)
    forwards: dict[int, str] = field(default_factory=dict)  # loopback port -> host Unix socket
    python: str = ""  # the interpreter that runs the init (its prefix must be in expose)
    tmpfs_bytes: int = 512 << 20
    pids_max: int = 512
    # The uid inside. A grader that confines the code under test in a user and pid namespace of
    # its own (wharf/tasks/tools/jail.py) needs nested user namespaces, and a uid other than 0: a
    # process of uid 0 without capabilities cannot map itself into a new user namespace.
    uid: int = SANDBOX_UID
    nested_userns: bool = False


def bwrap_args(spec: Spec, stage: dict[str, str], info_fd: int) -> list[str]:
    """The bwrap command line (pure). `stage`: host path -> where it is staged for the bind."""
    args = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net",
            "--unshare-uts", "--unshare-cgroup-try", "--uid", str(spec.uid), "--gid", str(spec.uid),
            "--hostname", "sandbox", *([] if spec.nested_userns else ["--disable-userns"]),
            "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--tmpfs", "/"]
    reopened = []  # system dirs rebuilt to hold a bind, made read-only again once it is in
    for name in SYSTEM_DIRS:
        host = f"/{name}"
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            inside = {t for t in spec.binds if os.path.dirname(t.rstrip("/")) == host}
            args += _system_dir(host, inside)
            reopened += [host] if inside else []
    args += ["--proc", "/proc", "--dev", "/dev"]
    # Parents before children: an install under a writable dir (a clone in /tmp: its venv, its
    # node_modules) is bound on top of that dir's tmpfs, not hidden under it.
    mounts = [(path, False) for path in spec.expose] + [(path, True) for path in spec.writable]
    for path, writable in sorted(mounts, key=lambda m: len(Path(m[0]).parts)):
        if writable:
            args += ["--size", str(spec.tmpfs_bytes), "--tmpfs", path, "--chmod", "0777", path]
        else:
            args += ["--ro-bind", stage.get(path, path), path]
    for target, path in sorted(spec.binds.items()):
        args += ["--ro-bind", stage.get(path, path), target]
    for host in reopened:
        args += ["--remount-ro", host]
    for port, sock in spec.forwards.items():
        args += ["--bind", stage.get(sock, sock), f"/run/wharf/{port}.sock"]
    args += ["--ro-bind", stage["init"], "/run/wharf/init.py"]
    args += ["--remount-ro", "/", "--info-fd", str(info_fd), "--as-pid-1", "--chdir", "/"]
    fwd = [f"{port}=/run/wharf/{port}.sock" for port in spec.forwards]
    return [*args, "--", spec.python, "-I", "/run/wharf/init.py", *fwd]


def _system_dir(host: str, binds: set[str]) -> list[str]:
    """A host system dir read-only. One that is to hold a bind is rebuilt from its entries on a
    tmpfs instead: bwrap cannot make the bind's mount point inside the host's own read-only dir."""
    if not binds:
        return ["--ro-bind", host, host]
    args = ["--tmpfs", host]
    for entry in sorted(os.listdir(host)):
        path = os.path.join(host, entry)
        if path in binds:
            continue  # the bind takes its place
        args += ["--symlink", os.readlink(path), path] if os.path.islink(path) else ["--ro-bind", path, path]
    return args


def _nested_in(path: str, others: list[str]) -> bool:
    return any(path != o and path.startswith(o.rstrip("/") + "/") for o in others)


def minimal_expose(paths: list[str]) -> list[str]:
    """Real paths, deduplicated, without those under a system dir or inside another one."""
    real = {os.path.realpath(p) for p in paths if p}
    real = {p for p in real if os.path.exists(p) and p.strip("/").split("/")[0] not in SYSTEM_DIRS}
    return sorted(p for p in real if not _nested_in(p, sorted(real)))


class Sandbox:
    """Start, join, freeze and end one sandbox. `host_uid`: the unprivileged uid it runs as
    (None: the invoking user, and no staging)."""

    def __init__(self, spec: Spec, parent: str | None = None):
        self.spec = spec
        self.host_uid = 2_000_000_000 + secrets.randbelow(1 << 24) if os.geteuid() == 0 else None
        if parent:
            Path(parent).mkdir(parents=True, exist_ok=True)
        if parent and self.host_uid is not None and not _traversable(Path(parent)):
            parent = None  # the sandbox's uid must reach its sockets and staged paths
        self.dir = Path(tempfile.mkdtemp(prefix="wharf-sbx-", dir=parent))
        self.cgroup: Path | None = None
        self.init_pid: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._fds: dict[str, int] = {}

    @property
    def alive(self) -> bool:
        return self.init_pid is not None

    # ---- life cycle --------------------------------------------------------------------

    async def start(self) -> None:
        self.cgroup = _make_cgroup(self.dir.name, self.spec.pids_max)
        stage = self._stage_paths()
        r, w = os.pipe()
        argv = bwrap_args(self.spec, stage, w)
        prefix = []
        if self.host_uid is not None:
            # bwrap itself runs as the sandbox's own host uid; paths it could not reach (a venv
            # under /root) are bind-staged first in a mount namespace private to this launch.
            mounts = "".join(f"mount --bind {_q(src)} {_q(dst)} && " for src, dst in stage.items() if src != "init")
            prefix = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                      f'{self._cg_join()}{mounts}exec "$@"', "sh", *self._as_host_uid()]
        elif self.cgroup is not None:
            prefix = ["sh", "-c", f'{self._cg_join()}exec "$@"', "sh"]
        self._proc = await asyncio.create_subprocess_exec(
            *prefix, *argv, pass_fds=(w,), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        os.close(w)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                info = await asyncio.to_thread(_read_all, r)
                ready = await self._proc.stdout.readline()
        except TimeoutError:
            info, ready = b"", b""
        if not info or ready.strip() != b"ready":
            err = (await self._proc.stderr.read()).decode(errors="replace") if self._proc.returncode is not None else ""
            await self.stop()
            raise SandboxStartError(f"the sandbox did not start: {err.strip() or f'no answer from its init in {START_TIMEOUT_S:.0f} s'}")
        self.init_pid = json.loads(info)["child-pid"]
        for ns in _NS:
            self._fds[ns] = os.open(f"/proc/{self.init_pid}/ns/{ns}", os.O_RDONLY)
        # --disable-userns, or a uid other than 0, nests the sandbox's user namespace in one that
        # owns its other namespaces: an exec enters that one first, the others from there, the
        # inner one last.
        outer = fcntl.ioctl(self._fds["user"], NS_GET_PARENT)
        if os.fstat(outer).st_ino == os.stat("/proc/self/ns/user").st_ino:
            os.close(outer)  # one user namespace: it owns the others
        else:
            self._fds["outer"] = outer

    async def freeze(self) -> None:
        """End every process in the sandbox; its files stay readable (run with pid=False)."""
        if self.init_pid is not None:
            _kill(self.init_pid)
            self.init_pid = None
        if self._proc is not None:
            try:  # bwrap reaps its init and exits
                await asyncio.wait_for(self._proc.wait(), timeout=5)
            except asyncio.TimeoutError:
                _kill(self._proc.pid)
                await self._proc.wait()

    async def stop(self) -> None:
        await self.freeze()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self.cgroup is not None:
            await _remove_cgroup(self.cgroup)
            self.cgroup = None
        await asyncio.to_thread(_unmount_and_remove, self.dir)

    # ---- joining -----------------------------------------------------------------------

    def join_argv(self, argv: list[str], env: dict[str, str], cwd: str, pid: bool = True) -> tuple[list[str], list[int]]:
        """The host command line that runs argv inside the sandbox, and the fds it needs."""
        if not self._fds:
            raise RuntimeError("the sandbox is not started")
        names = [n for n in ("mnt", "pid", "net", "ipc", "uts", "user") if pid or n != "pid"]
        ns = [f"--{'mount' if n == 'mnt' else n}=/proc/self/fd/{self._fds[n]}" for n in names]
        outer = ["nsenter", f"--user=/proc/self/fd/{self._fds['outer']}", "--preserve-credentials", "--"] \
            if "outer" in self._fds else []
        # Entering a user namespace gives a full capability set, bounding set included: drop it
        # all inside, so that the command (root in the sandbox) runs with none.
        cmd = [*self._as_host_uid(), *outer, "nsenter", *ns, "--preserve-credentials", "--", *_DROP,
               "/usr/bin/env", "-i", "-C", cwd, *(f"{k}={v}" for k, v in env.items()), *argv]
        if self.cgroup is not None and pid:
            # into the pids cgroup before anything forks (a shell: a Python preexec_fn would
            # make every exec fork the whole harbor process)
            cmd = ["sh", "-c", f'{self._cg_join()}exec "$@"', "sh", *cmd]
        return cmd, [self._fds[n] for n in (*names, "outer") if n in self._fds]

    def _as_host_uid(self) -> list[str]:
        if self.host_uid is None:
            return []
        u = str(self.host_uid)
        return ["setpriv", f"--reuid={u}", f"--regid={u}", "--clear-groups", *_DROP[1:-1]]

    def _cg_join(self) -> str:
        return f"echo $$ > {_q(str(self.cgroup / 'cgroup.procs'))} && " if self.cgroup else ""

    def _stage_paths(self) -> dict[str, str]:
        init = self.dir / "init.py"
        init.write_text(INIT_SOURCE)
        init.chmod(0o644)
        stage: dict[str, str] = {"init": str(init)}
        if self.host_uid is None:
            return stage
        os.chmod(self.dir, 0o711)  # traversable by the sandbox's uid, not listable
        for i, path in enumerate(dict.fromkeys([*self.spec.expose, *self.spec.binds.values()])):
            dst = self.dir / f"stage{i}"
            (dst.mkdir if os.path.isdir(path) else dst.touch)()
            stage[path] = str(dst)
        for sock in self.spec.forwards.values():
            os.chown(sock, self.host_uid, self.host_uid)
            os.chown(os.path.dirname(sock), self.host_uid, self.host_uid)
        return stage


def _traversable(path: Path) -> bool:
    """Every dir from / to path searchable by other users."""
    path = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _read_all(fd: int) -> bytes:
    """bwrap's --info-fd JSON: complete once it is parseable (bwrap keeps the fd open)."""
    buf = b""
    while chunk := os.read(fd, 4096):
        buf += chunk
        try:
            json.loads(buf)
            break
        except ValueError:
            continue
    os.close(fd)
    return buf


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _make_cgroup(name: str, pids_max: int) -> Path | None:
    """A pids cgroup for the sandbox (v1 pids hierarchy or cgroup2), or None where none can be made."""
    for root in map(Path, _CGROUP_ROOTS):
        if not (root / "cgroup.procs").exists() or not os.access(root, os.W_OK):
            continue
        path = root / name
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(pids_max))  # absent: no pids controller here
            return path
        except OSError:
            try:
                path.rmdir()
            except OSError:
                pass
    return None


async def _remove_cgroup(path: Path) -> None:
    for _ in range(50):  # the kernel frees the cgroup once its last process is reaped
        try:
            path.rmdir()
            return
        except OSError:
            await asyncio.sleep(0.05)


def _unmount_and_remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
