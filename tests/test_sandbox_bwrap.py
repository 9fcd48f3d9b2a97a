"""BwrapEnvironment on its own: exec, env, cwd, timeout, transfers, persistence, stop()."""
from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from collect.sandbox.bwrap import MARKER, BwrapEnvironment, SandboxTimeoutError

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def make_env(tmp_path: Path, files: dict[str, str] | None = None, **kwargs) -> BwrapEnvironment:
    env_dir = tmp_path / "task" / "environment"
    env_dir.mkdir(parents=True)
    for name, text in (files or {}).items():
        (env_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (env_dir / name).write_text(text)
    paths = TrialPaths(trial_dir=tmp_path / "trial")
    paths.mkdir()
    mounts = [
        {"type": "bind", "source": str(paths.agent_dir), "target": "/logs/agent"},
        {"type": "bind", "source": str(paths.verifier_dir), "target": "/logs/verifier"},
    ]
    return BwrapEnvironment(
        environment_dir=env_dir,
        environment_name="t",
        session_id="t__env",
        trial_paths=paths,
        task_env_config=EnvironmentConfig(),
        mounts=mounts,
        state_dir=str(tmp_path / "state"),
        **kwargs,
    )


def run(coro):
    return asyncio.run(coro)


def test_exec_cwd_env_files_and_persistence(tmp_path):
    env = make_env(tmp_path, {"calc.py": "def add(a, b):\n    return a - b\n", "pkg/x.txt": "x\n"})

    async def go():
        await env.start(force_build=False)
        try:
            r = await env.exec("pwd; ls; cat calc.py")
            assert r.return_code == 0, r.stderr
            assert r.stdout.splitlines()[0] == "/app"
            assert "calc.py" in r.stdout and "return a - b" in r.stdout
            # environment/ files are committed as a git repo so diffs work
            r = await env.exec("git log --oneline | wc -l; git status --porcelain | wc -l")
            assert r.stdout.split() == ["1", "0"]
            # cwd and env
            r = await env.exec('echo "$FOO:$HOME:$(pwd)"', cwd="/tmp", env={"FOO": "bar"})
            assert r.stdout.strip() == "bar:/home/agent:/tmp"
            # exit code and stderr kept apart
            r = await env.exec("echo out; echo err >&2; exit 3")
            assert (r.return_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
            # writes persist across execs, in the workdir and elsewhere in the sandbox root
            await env.exec("sed -i 's/a - b/a + b/' calc.py && mkdir -p /opt2 && echo 1 > /opt2/f && echo h > ~/h")
            r = await env.exec("cat calc.py /opt2/f ~/h")
            assert "a + b" in r.stdout and r.stdout.endswith("1\nh\n")
            # the host's dirs are read-only in the sandbox; the host is untouched
            r = await env.exec("touch /usr/wharf_should_fail")
            assert r.return_code != 0 and not Path("/usr/wharf_should_fail").exists()
            # the project venv's python is exported for verifiers
            r = await env.exec('"$WHARF_PYTHON" -c "import swebench, pytest; print(1)"')
            assert r.return_code == 0 and r.stdout.strip() == "1", r.stderr
            # a bad cwd is a failed exec, not a hang or a crash
            r = await env.exec("true", cwd="/does/not/exist")
            assert r.return_code != 0 and "/does/not/exist" in (r.stderr or "")
        finally:
            await env.stop(delete=True)

    run(go())


def test_logs_are_binds_onto_the_trial_dir(tmp_path):
    env = make_env(tmp_path)

    async def go():
        await env.start(force_build=False)
        try:
            await env.exec("echo 1.0 > /logs/verifier/reward.txt && echo hi > /logs/agent/a.log")
        finally:
            await env.stop(delete=True)

    run(go())
    assert (tmp_path / "trial" / "verifier" / "reward.txt").read_text() == "1.0\n"
    assert (tmp_path / "trial" / "agent" / "a.log").read_text() == "hi\n"
    assert not any((tmp_path / "state").iterdir()), "stop(delete=True) leaves no state behind"
    assert env.capabilities.mounted


def test_upload_download_file_and_dir(tmp_path):
    env = make_env(tmp_path)
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.sh").write_text("#!/bin/bash\necho a\n")
    (src / "a.sh").chmod(0o755)
    (src / "sub" / "b.txt").write_text("b\n")
    single = tmp_path / "one.txt"
    single.write_text("one\n")

    async def go():
        await env.start(force_build=False)
        try:
            await env.upload_dir(src, "/tests")
            await env.upload_file(single, "/deep/new/dir/one.txt")
            r = await env.exec("/tests/a.sh && cat /tests/sub/b.txt /deep/new/dir/one.txt")
            assert r.return_code == 0 and r.stdout == "a\nb\none\n", r.stderr
            # a relative target lands in the workdir
            await env.upload_file(single, "rel.txt")
            assert (await env.exec("cat /app/rel.txt")).stdout == "one\n"
            await env.exec("mkdir -p /app/out/x && echo y > /app/out/x/y && ln -s /tests/sub/b.txt /app/out/link")
            await env.download_dir("/app/out", tmp_path / "got")
            await env.download_file("/tests/sub/b.txt", tmp_path / "got_b.txt")
            # a symlink an agent planted resolves inside the sandbox (read-only /etc), not on the host
            await env.exec("ln -s /etc/hostname /app/hn")
            before = Path("/etc/hostname").read_bytes()
            with pytest.raises(RuntimeError, match="upload"):
                await env.upload_file(single, "/app/hn")
            assert Path("/etc/hostname").read_bytes() == before
            with pytest.raises(RuntimeError, match="download /nope"):
                await env.download_file("/nope", tmp_path / "nope")
        finally:
            await env.stop(delete=True)

    run(go())
    assert (tmp_path / "got" / "x" / "y").read_text() == "y\n"
    # an absolute link would point into the host: it is skipped, the rest still arrives
    assert not (tmp_path / "got" / "link").exists() and not (tmp_path / "got" / "link").is_symlink()
    assert (tmp_path / "got_b.txt").read_text() == "b\n"
    assert not (tmp_path / "nope").exists()


def test_timeout_raises_and_kills_the_command(tmp_path):
    env = make_env(tmp_path)

    async def go():
        await env.start(force_build=False)
        try:
            t0 = time.monotonic()
            with pytest.raises(SandboxTimeoutError, match="timed out after 1"):
                await env.exec("sleep 30; echo done > /app/late", timeout_sec=1)
            assert time.monotonic() - t0 < 10
            await asyncio.sleep(0.2)
            assert _sandbox_pids(env._id) == [], "the timed-out command's processes are gone"
            assert (await env.exec("ls /app")).stdout is None
            # a timeout is a RuntimeError, as harbor's docker environment raises
            assert issubclass(SandboxTimeoutError, RuntimeError)
        finally:
            await env.stop(delete=True)

    run(go())


def _sandbox_pids(env_id: str) -> list[int]:
    needle = f"{MARKER}={env_id}".encode()
    pids = []
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                if needle in Path(f"/proc/{n}/environ").read_bytes().split(b"\0"):
                    pids.append(int(n))
            except OSError:
                pass
    return pids


def test_daemons_survive_execs_and_stop_kills_them(tmp_path):
    env = make_env(tmp_path)

    async def go():
        await env.start(force_build=False)
        # a daemon that detaches (new session, no inherited pipes) like tmux's server
        r = await env.exec("setsid sleep 300 >/dev/null 2>&1 < /dev/null & echo started")
        assert r.stdout.strip() == "started"
        await asyncio.sleep(0.3)
        assert _sandbox_pids(env._id), "the daemon outlives the exec that started it"
        assert (await env.exec("pgrep -x sleep >/dev/null && echo alive")).stdout.strip() == "alive"
        await env.stop(delete=False)
        assert _sandbox_pids(env._id) == []
        await env.stop(delete=True)

    run(go())


def test_no_network_policy_cuts_the_network(tmp_path):
    from harbor.models.task.config import NetworkMode, NetworkPolicy

    env = make_env(tmp_path)

    async def go():
        await env.start(force_build=False)
        try:
            ifaces = "awk 'NR > 2 {print $1}' /proc/net/dev"
            assert len((await env.exec(ifaces)).stdout.split()) > 1  # the host's network by default
            await env.set_network_policy(NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
            assert (await env.exec(ifaces)).stdout.split() == ["lo:"]
        finally:
            await env.stop(delete=True)

    run(go())


def test_missing_bwrap_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="apt-get install -y bubblewrap"):
        make_env(tmp_path)
