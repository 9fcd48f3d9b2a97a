"""Run the code under test where it cannot see, signal or outlive the grader that started it.

Standalone (stdlib only): used by the graders (judge_calls.py, pytest_grade.py) inside the
verifier sandbox, and by the tests on a host. `start(argv, ...)` runs argv under bubblewrap in
namespaces of its own:
  * a user namespace nested in the grader's (no capability, no further user namespace) and a
    pid namespace of its own, with a fresh /proc: the grader and every other process of the
    verifier are not in its view, so no signal, ptrace or /proc read can name them;
  * the filesystem read-only but for the workspace and a fresh /tmp: it cannot write the
    verifier's output dir, the grader's tools or its interpreter;
  * its own network (loopback) and IPC namespaces, a new session (no terminal to inject into).
`end(run)` SIGKILLs the namespace's init: the kernel then kills every process in it, however it
forked or daemonized, and the init's pidfd turns readable only once they are all gone. If that
does not happen in END_WAIT seconds, `end` says so and the grader gives no verdict 1.0.

Where bubblewrap or nested user namespaces are unavailable (a Docker verifier, a host without
them), the fallback is the process group plus the grader as subreaper: every process reparented
to the grader is SIGKILLed until none is left, and any left after that is reported the same way.
The fallback does not hide the grader: `confined` says which one ran.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
END_WAIT = 10.0  # seconds for the kernel to empty the namespace
_PROBE: dict[str, str | None] = {}
CONFINED = "bwrap: user, pid, ipc and network namespaces of its own, the filesystem read-only but the workspace"


def bwrap_argv(workdir: str, keep: list[str], info_fd: int, source: str | None = None,
               read_only: tuple[str, ...] = ()) -> list[str]:
    """bubblewrap's command line up to `--` (pure). `keep`: paths under /tmp shown read-only
    over its fresh tmpfs (a clone or a venv that lives there). `source`: the directory shown,
    writable, at `workdir` (default: workdir itself); `read_only`: paths relative to it bound
    read-only over it (the test files: the code under test cannot rewrite them)."""
    args = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--disable-userns",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--tmpfs", "/tmp"]
    for path in sorted(keep, key=lambda p: p.count("/")):
        args += ["--ro-bind", path, path]
    args += ["--bind", source or workdir, workdir]
    for rel in read_only:
        args += ["--ro-bind", os.path.join(source or workdir, rel), os.path.join(workdir, rel)]
    return args + ["--proc", "/proc", "--dev", "/dev", "--info-fd", str(info_fd),
                   "--chdir", workdir, "--"]


def kept_paths(python: str) -> list[str]:
    """What the child needs that a fresh /tmp would hide: these tools, the interpreters' prefixes."""
    paths = {HERE, sys.prefix, sys.base_prefix}
    for p in (os.path.abspath(python), os.path.realpath(python)):
        paths.add(os.path.dirname(os.path.dirname(p)))
    real = {os.path.realpath(p) for p in paths if os.path.exists(p)}
    return sorted(p for p in real if p == "/tmp" or p.startswith("/tmp/"))


def unavailable() -> str | None:
    """Why confinement cannot be had here (probed once per process), or None."""
    if "why" not in _PROBE:
        _PROBE["why"] = _probe()
    return _PROBE["why"]


def _probe() -> str | None:
    if shutil.which("bwrap") is None or not hasattr(os, "pidfd_open"):
        return "no bwrap or no pidfd on this system"
    r, w = os.pipe()
    try:
        p = subprocess.run(bwrap_argv("/", [], w) + ["true"], pass_fds=(w,), capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap did not run: {e}"
    finally:
        os.close(w)
        os.close(r)
    return None if p.returncode == 0 else "bwrap refused: " + p.stderr.decode("utf-8", "replace").strip()[:300]


class Run:
    """A started process: `proc` (its stdin/stdout/stderr as asked), confined or not."""

    def __init__(self, proc: subprocess.Popen, pidfd: int | None, confined: bool):
        self.proc, self.pidfd, self.confined = proc, pidfd, confined


def start(argv: list[str], workdir: str, python: str, pass_fds: tuple = (), source: str | None = None,
          read_only: tuple[str, ...] = (), **popen) -> Run:
    """argv started in its own namespaces when it can be (see the module doc), else in a new
    process group. `source`, `read_only`: see bwrap_argv (unconfined: it runs in `source`, and
    nothing is read-only). `popen`: subprocess.Popen's other arguments (stdin, stdout, env, ...)."""
    if unavailable():
        proc = subprocess.Popen(argv, cwd=source or workdir, pass_fds=pass_fds, start_new_session=True, **popen)
        return Run(proc, None, False)
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(bwrap_argv(workdir, kept_paths(python), w, source, read_only) + argv,
                                pass_fds=(*pass_fds, w),
                                start_new_session=True, **popen)
    finally:
        os.close(w)
    try:
        pid = _child_pid(r)
        pidfd = os.pidfd_open(pid) if pid else None
    except OSError:  # gone already: its namespace went with it
        pidfd = None
    finally:
        os.close(r)
    return Run(proc, pidfd, True)


def _child_pid(fd: int, timeout: float = 30.0) -> int | None:
    """The namespace init's pid from bubblewrap's --info-fd, or None if it wrote none."""
    buf, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            break
        buf += chunk
        try:
            return int(json.loads(buf)["child-pid"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def end(run: Run) -> str | None:
    """Kill everything `run` started; None when nothing of it is left, else why not."""
    for target in (lambda: os.killpg(run.proc.pid, signal.SIGKILL), run.proc.kill):
        try:
            target()
        except OSError:
            pass
    if run.pidfd is not None:
        try:
            signal.pidfd_send_signal(run.pidfd, signal.SIGKILL)
        except OSError:
            pass  # already gone
        ready, _, _ = select.select([run.pidfd], [], [], END_WAIT)
        os.close(run.pidfd)
        run.pidfd = None
        run.proc.wait()
        return None if ready else f"the code under test's namespace still had processes {END_WAIT:.0f} s after its end"
    run.proc.wait()
    return None if run.confined else _reap_orphans()


def _reap_orphans(passes: int = 200) -> str | None:
    """The fallback: SIGKILL every process reparented to this one (its subreaper) until none is left."""
    for _ in range(passes):
        kids = _children()
        if not kids:
            return None
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
    return f"processes the code under test started were still alive after {passes} rounds of SIGKILL"


def _children() -> list[int]:
    me, out = os.getpid(), []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            if int(stat[stat.rindex(b")") + 2:].split()[1]) == me:
                out.append(int(name))
        except (OSError, ValueError):
            continue
    return out
