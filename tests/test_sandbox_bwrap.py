"""BwrapEnvironment on its own: exec, env, cwd, timeout, transfers, persistence, stop(), the
boundary (namespaces, no capability, no host path beyond the allowed ones) and the two phases."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from wharf.collect.sandbox import ns
from wharf.collect.sandbox.bwrap import BwrapEnvironment
from wharf.collect.sandbox.process import SandboxTimeoutError

from tests.conftest import needs_bwrap

pytestmark = needs_bwrap


def make_env(tmp_path: Path, files: dict[str, str] | None = None, **kwargs) -> BwrapEnvironment:
    env_dir = tmp_path / "task" / "environment"
    env_dir.mkdir(parents=True)
    for name, text in (files or {}).items():
        (env_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (env_dir / name).write_text(text)
    paths = TrialPaths(trial_dir=tmp_path / "trial")
    paths.mkdir()
    return BwrapEnvironment(
        environment_dir=env_dir,
        environment_name="t",
        session_id="t__env",
        trial_paths=paths,
        task_env_config=EnvironmentConfig(),
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
            # writes persist across execs, in the workdir, /tmp and HOME; the root is read-only
            await env.exec("sed -i 's/a - b/a + b/' calc.py && mkdir -p /tmp/d && echo 1 > /tmp/d/f && echo h > ~/h")
            r = await env.exec("cat calc.py /tmp/d/f ~/h")
            assert "a + b" in r.stdout and r.stdout.endswith("1\nh\n")
            assert (await env.exec("mkdir /opt2")).return_code != 0
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


def test_agent_logs_are_downloaded_and_no_state_is_left(tmp_path):
    env = make_env(tmp_path)

    async def go():
        await env.start(force_build=False)
        host_dir = env._sandbox.dir
        try:
            await env.exec("echo hi > /logs/agent/a.log")
            # no verifier dir in the agent phase: a reward cannot be planted there
            r = await env.exec("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt")
            assert r.return_code != 0
            await env.download_dir("/logs/agent", tmp_path / "trial" / "agent")
        finally:
            await env.stop(delete=True)
        assert not host_dir.exists(), "stop() leaves no state behind"

    run(go())
    assert (tmp_path / "trial" / "agent" / "a.log").read_text() == "hi\n"
    assert not env.capabilities.mounted


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
            await env.upload_file(single, "/tmp/deep/new/dir/one.txt")
            r = await env.exec("/tests/a.sh && cat /tests/sub/b.txt /tmp/deep/new/dir/one.txt")
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
            for _ in range(50):  # killed at once; reaped by the sandbox's init soon after
                if len(_sandbox_pids(env)) == 1:
                    break
                await asyncio.sleep(0.1)
            assert len(_sandbox_pids(env)) == 1, "the timed-out command's processes are gone"
            assert (await env.exec("ls /app")).stdout is None
            # a timeout is a RuntimeError, as harbor's docker environment raises
            assert issubclass(SandboxTimeoutError, RuntimeError)
        finally:
            await env.stop(delete=True)

    run(go())


def _sandbox_pids(env: BwrapEnvironment) -> list[int]:
    """Host pids of the processes in env's pid namespace."""
    try:
        ns = os.readlink(f"/proc/{env._sandbox.init_pid}/ns/pid")
    except (OSError, AttributeError, TypeError):
        return []
    pids = []
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                if os.readlink(f"/proc/{n}/ns/pid") == ns:
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
        assert len(_sandbox_pids(env)) >= 2, "the daemon outlives the exec that started it"
        assert (await env.exec("pgrep -x sleep >/dev/null && echo alive")).stdout.strip() == "alive"
        init = env._sandbox.init_pid
        await env.stop(delete=True)
        assert not Path(f"/proc/{init}").exists()

    run(go())


def test_the_boundary(tmp_path):
    """Own namespaces, no capability, no host process, no host path beyond the allowed ones."""
    env = make_env(tmp_path)
    secret = Path(os.path.expanduser("~")) / ".wharf-test-secret"

    async def go():
        await env.start(force_build=False)
        try:
            r = await env.exec("grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; ps -e --no-headers | wc -l")
            lines = r.stdout.split()
            assert lines[1] == "0000000000000000" and lines[3] == "0000000000000000" and lines[5] == "1"
            assert int(lines[6]) <= 4, "only the sandbox's own processes are visible"
            for ns in ("user", "pid", "net", "ipc", "uts", "mnt"):
                inside = (await env.exec(f"readlink /proc/self/ns/{ns}")).stdout.strip()
                assert inside != os.readlink(f"/proc/self/ns/{ns}"), ns
            r = await env.exec(f"ls {REPO / 'datasets'} /root/.bashrc {secret}; cat /etc/shadow {REPO / 'wharf/core/config.py'}")
            assert r.return_code != 0 and not r.stdout
            # the repo dir holds only the path down to the agent CLIs bound at their real path
            # (wharf/collect/agents/node/node_modules, when `make agents` installed them): no source
            r = await env.exec(f"ls {REPO} {REPO / 'wharf'} {REPO / 'wharf/collect'} {REPO / 'wharf/collect/agents'}")
            assert set((r.stdout or "").split()) <= {f"{REPO}:", "wharf", f"{REPO / 'wharf'}:", "collect",
                                                     f"{REPO / 'wharf/collect'}:", "agents",
                                                     f"{REPO / 'wharf/collect/agents'}:", "node"}, r.stdout
            ifaces = (await env.exec("awk 'NR > 2 {print $1}' /proc/net/dev")).stdout.split()
            assert ifaces == ["lo:"], "loopback only"
            # the agent's python (the venv) runs; the project's own package is not importable
            r = await env.exec('"$WHARF_PYTHON" -c "import pytest; print(1)"; "$WHARF_PYTHON" -c "import wharf"')
            assert r.stdout.strip() == "1" and "ModuleNotFoundError" in r.stderr
            # the writable dirs are size-limited (a full disk stays in the sandbox)
            r = await env.exec("head -c 400M /dev/zero > /tmp/big; echo rc=$?")
            assert "No space left" in r.stderr and "rc=1" in r.stdout
            # no nested user namespace, no way to regain privileges
            assert (await env.exec("unshare -U true")).return_code != 0
        finally:
            await env.stop(delete=True)

    secret.write_text("s")
    try:
        run(go())
    finally:
        secret.unlink()


REPO = Path(__file__).resolve().parents[1]


def test_verification_gets_a_clean_copy_plus_the_agents_change(tmp_path):
    env = make_env(tmp_path, {"calc.py": "def add(a, b):\n    return a - b\n"})
    tests = tmp_path / "task" / "tests"
    tests.mkdir()
    (tests / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(1, 2) == 3\n")

    async def go():
        await env.start(force_build=False)
        try:
            await env.exec("sed -i 's/a - b/a + b/' calc.py; echo 'x' > conftest.py; echo hack > test_calc.py; "
                           "mkdir -p sub && echo 1 > sub/x.pth; echo junk > /tmp/junk; echo x > pytest.py; "
                           "ln -s /etc/passwd link; setsid sleep 300 >/dev/null 2>&1 </dev/null &")
            agent_init = env._sandbox.init_pid
            assert env.phase == "agent"
            await env.upload_dir(tests, "/tests")
            assert env.phase == "verifier" and not Path(f"/proc/{agent_init}").exists()
            r = await env.exec("ls -A /app /tmp; cat /app/calc.py /tests/test_calc.py; git status --short; pgrep sleep")
            assert "a + b" in r.stdout and "assert add(1, 2) == 3" in r.stdout
            for gone in ("conftest.py", "pytest.py", "junk", "link"):
                assert gone not in r.stdout.split(), gone
            assert (await env.exec("ls -A /app/sub")).stdout is None, "the .pth file stays out"
            assert " M calc.py" in r.stdout and "sleep" not in r.stdout
            # the verifier runs as uid 1000 and may nest a user namespace: the grader confines the
            # code under test in one (wharf/tasks/tools/jail.py); the agent phase may not (test_the_boundary)
            r = await env.exec("id -u; unshare -U true && echo nested")
            assert r.stdout.split() == ["1000", "nested"], (r.stdout, r.stderr)
            await env.exec("echo 1 > /logs/verifier/reward.txt")
            await env.download_dir("/logs/verifier", tmp_path / "trial" / "verifier")
        finally:
            await env.stop(delete=True)

    run(go())
    report = json.loads((tmp_path / "trial" / "verifier" / "agent_change.json").read_text())
    assert report["changed"] == ["calc.py"]
    assert set(report["set_aside"]) == {"conftest.py", "test_calc.py", "sub/x.pth", "pytest.py", "link"}


def test_a_sandbox_whose_init_does_not_answer_is_an_infra_failure_and_leaves_nothing(tmp_path, monkeypatch):
    """A host too busy to start the sandbox in time (here: no time at all) is not the agent's failure."""
    monkeypatch.setattr(ns, "START_TIMEOUT_S", 0.001)
    env = make_env(tmp_path)

    async def go():
        try:
            with pytest.raises(ns.SandboxStartError, match="no answer from its init"):
                await env.start(force_build=False)
            sb = env._sandbox
            assert sb.init_pid is None and sb._proc.returncode is not None  # bwrap and its init are gone
        finally:
            await env.stop(delete=True)

    run(go())  # classified infra_error by its name: tests/test_collect_plan.py


def test_missing_bwrap_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="apt-get install -y bubblewrap"):
        make_env(tmp_path)


def test_an_install_under_a_writable_dir_is_bound_over_its_tmpfs():
    """A clone in /tmp: its venv and node_modules must not be hidden by the sandbox's /tmp."""
    from wharf.collect.sandbox.ns import Spec, bwrap_args

    spec = Spec(writable=["/app", "/tmp"], expose=["/tmp/clone/.venv", "/tmp/clone/collect/agents/node/node_modules"],
                python="/tmp/clone/.venv/bin/python")
    args = bwrap_args(spec, {"init": "/x/init.py"}, 3)
    tmp = next(i for i in range(len(args) - 1) if args[i:i + 2] == ["--tmpfs", "/tmp"])
    for path in spec.expose:
        assert args.index(path) > tmp, path


def test_a_bind_into_a_system_dir_is_read_only_and_keeps_the_dirs_entries():
    """An agent's fixed path (/opt/openhands-venv): /opt is rebuilt from its entries on a tmpfs
    (bwrap cannot make a mount point in the host's read-only /opt), read-only again after the bind."""
    from wharf.collect.sandbox.ns import Spec, bwrap_args

    spec = Spec(writable=["/app"], binds={"/opt/wharf-venv": "/host/venv"}, python="/v/bin/python")
    args = bwrap_args(spec, {"init": "/x/init.py"}, 3)
    assert args[args.index("/opt") - 1] == "--tmpfs"
    assert not any(args[i:i + 3] == ["--ro-bind", "/opt", "/opt"] for i in range(len(args)))
    bind = args.index("/host/venv")
    assert args[bind - 1:bind + 2] == ["--ro-bind", "/host/venv", "/opt/wharf-venv"]
    assert args.index("--remount-ro") > bind and args[args.index("--remount-ro") + 1] == "/opt"
    for entry in os.listdir("/opt"):
        assert f"/opt/{entry}" in args, entry
    plain = bwrap_args(Spec(writable=["/app"], python="/v/bin/python"), {"init": "/x/init.py"}, 3)
    assert plain[plain.index("/opt") - 1:plain.index("/opt") + 2] == ["--ro-bind", "/opt", "/opt"]


def test_the_agents_fixed_path_shows_its_venv_read_only_in_the_agent_phase_only(tmp_path, monkeypatch):
    from wharf.collect.sandbox import bwrap

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "marker").write_text("the venv\n")
    monkeypatch.setattr(bwrap, "_AGENT_BINDS", {"/opt/wharf-test-venv": str(venv)})
    env = make_env(tmp_path / "e")

    async def go():
        await env.start(force_build=False)
        try:
            r = await env.exec("cat /opt/wharf-test-venv/bin/marker; ls /opt")
            assert r.stdout.splitlines()[0] == "the venv"
            assert set(r.stdout.splitlines()[1:]) == set(os.listdir("/opt")) | {"wharf-test-venv"}
            for path in ("/opt/wharf-test-venv/x", "/opt/x"):
                assert (await env.exec(f"touch {path}")).return_code != 0, path
            assert (await env.exec(f"ls {venv}")).return_code != 0  # the host path itself is not shown
            await env.upload_dir(tmp_path / "e" / "task" / "environment", "/tests")  # the verifier's sandbox
            assert (await env.exec("ls /opt/wharf-test-venv")).return_code != 0
        finally:
            await env.stop(delete=True)

    run(go())
    assert sorted(p.name for p in venv.rglob("*")) == ["bin", "marker"]
