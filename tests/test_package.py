"""wharf as an installed package: the built wheel carries what runs need (the default configs, the
bundled toy tasks, the sealer's and kernels' sources); installed into a fresh venv outside the
checkout it runs `wharf demo` from any directory, and nothing of it is a top-level `train`; the
carried copies are used only when the current directory lacks the path (wharf/core/bundled.py).

The fresh venv gets the built wheel with --no-deps; its dependencies come from this venv's
site-packages through a .pth file (the checkout itself is never on its path), so the test does not
install torch again."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from wharf.core import bundled
from wharf.core.config import ConfigError, load_config
from conftest import free_port, needs_bwrap

REPO = Path(__file__).resolve().parents[1]


def tracked_copy(dest: Path) -> Path:
    """The files git holds (symlinks kept as links), copied to `dest`: a wheel built from a clone,
    not from this checkout, whose build/ may hold a module since removed, and which the build
    would leave behind in it."""
    r = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    for rel in filter(None, r.stdout.decode().split("\0")):
        src, dst = REPO / rel, dest / rel
        if not src.exists() and not src.is_symlink():  # deleted in the work tree, not yet committed
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dst)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    src = tracked_copy(tmp_path_factory.mktemp("clone"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                        str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = out.glob("wharf-*.whl")
    return whl


def tracked(folder: str) -> set[str]:
    """The files git holds under `folder` (a checkout's own caches, e.g. __pycache__, left out)."""
    r = subprocess.run(["git", "ls-files", folder], cwd=REPO, capture_output=True, text=True, check=True)
    return {str(Path(p).relative_to(folder)) for p in r.stdout.split()}


def test_the_wheel_carries_configs_toy_tasks_and_c_sources(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n.removeprefix("wharf/data/configs/") for n in names if n.startswith("wharf/data/configs/")} \
        == tracked("configs")
    assert {n.removeprefix("wharf/data/datasets/toy/") for n in names if n.startswith("wharf/data/datasets/toy/")} \
        == tracked("datasets/toy")
    for source in ("wharf/tasks/tools/wharf_seal.c", "wharf/tasks/tools/build_seal.sh", "wharf/tasks/tools/judge.sh",
                   "wharf/core/cpu_linear.c", "wharf/engine/cpu_layer.c", "wharf/engine/cpu_race.c",
                   "wharf/collect/sandbox/init.py"):
        assert source in names, source
    # built here, not sources: the sealer's .so (a wheel of no platform) and bytecode; nor the test doubles
    assert not [n for n in names if n.endswith((".so", ".pyc")) or n.startswith("testing/")]
    assert {n.split("/")[0] for n in names} == {"wharf", wheel.name.split("-py3")[0] + ".dist-info"}


def test_carried_paths_serve_only_where_the_current_directory_lacks_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config("configs/default.yaml")  # no configs/ here: the carried copy
    assert Path(cfg.collect.dataset) == (REPO / "datasets/toy").resolve() and cfg.collect.concurrency == 8
    assert load_config("default").collect.concurrency == 8  # a carried config by its bare name
    (tmp_path / "datasets/toy").mkdir(parents=True)  # a directory of the user's own wins
    assert load_config("default").collect.dataset == "datasets/toy"
    assert load_config(None, ["collect.dataset=datasets/multiturn"]).collect.dataset == "datasets/multiturn"
    with pytest.raises(ConfigError, match=r"nope.yaml: cannot read config .*wharf carries .*default"):
        load_config("nope.yaml")


def test_the_cache_is_the_checkouts_or_the_users_never_site_packages(tmp_path, monkeypatch):
    monkeypatch.setenv("WHARF_CACHE", str(tmp_path / "c"))
    assert bundled.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("WHARF_CACHE")
    assert bundled.checkout_root() == REPO and bundled.cache_dir() == REPO / ".cache" / "wharf"
    monkeypatch.setattr(bundled, "PACKAGE_PARENT", tmp_path / "site-packages")  # an install: no pyproject.toml
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert bundled.checkout_root() is None and bundled.cache_dir() == tmp_path / "xdg" / "wharf"


def fresh_venv(root: Path, wheel: Path) -> Path:
    """A venv with the wheel alone installed; this venv's site-packages (never the checkout) behind it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    py = root / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = sysconfig.get_paths()["purelib"]
    assert not Path(deps, "wharf").exists()  # this venv holds wharf as an editable link, not a copy
    Path(site, "wharf-deps.pth").write_text(deps + "\n")
    # not from the checkout, nor with it on PYTHONPATH: pip would take its wharf.egg-info for an install
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
                   check=True, timeout=300, cwd=root, env=clean)
    assert (root / "bin" / "wharf").is_file()
    return py


@pytest.mark.slow
@needs_bwrap
def test_the_installed_wheel_runs_the_demo_from_any_directory(wheel, tmp_path):
    py = fresh_venv(tmp_path / "venv", wheel)
    work = tmp_path / "anywhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "XDG_CACHE_HOME")}
    env["WHARF_CACHE"] = str(bundled.cache_dir())  # the converted model and built kernels of this checkout
    run = (lambda *argv, **kw: subprocess.run(list(argv), cwd=work, env={**env, **kw}, capture_output=True, text=True,
                                              timeout=900))
    wharf = str(py.parent / "wharf")
    version = run(wharf, "--version")
    assert version.returncode == 0 and version.stdout.strip() == "wharf 0.1.0", version
    where = run(str(py), "-c", "import wharf, wharf.core.bundled as b; print(wharf.__file__, b.checkout_root(), "
                               "b.cache_dir())", WHARF_CACHE="", HOME=str(work))
    assert where.stdout.split() == [str(py.parent.parent / "lib/python3.12/site-packages/wharf/__init__.py"),
                                    "None", str(work / ".cache/wharf")], where
    no_train = run(str(py), "-c", "import train")
    assert "No module named 'train'" in no_train.stderr, no_train
    port = free_port()
    demo = run(wharf, "demo", "collect.tasks=[write-hello]", "collect.attempts=2", f"engine.port={port}",
               f"endpoint.url=http://127.0.0.1:{port}", f"proxy.port={free_port()}")
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-3000:]
    assert "collect.dataset=datasets/toy: not under" in demo.stderr and "using the copy wharf carries" in demo.stderr  # said by collect
    assert "collect: 2/2 rollouts" in demo.stdout and "audited 2 rollouts (0 without a trajectory we read): 0 problems" in demo.stdout, demo.stdout
    assert (work / "runs/default/rounds/0/collect/rollouts.parquet").is_file()


def test_the_engine_child_gets_absolute_paths_it_starts_elsewhere(tmp_path, monkeypatch):
    from wharf.core.configio import read_yaml
    from wharf.engine import launch

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models/m").mkdir(parents=True)
    for model, want in (("models/m", str(tmp_path / "models/m")), ("Org/Name", "Org/Name"), (None, None)):
        cfg = load_config(None, [f"engine.model={model if model else 'null'}"])
        argv = launch._engine_command(cfg, "127.0.0.1", 8100, Path("logs/e.yaml"), "key")
        assert argv[-2] == "--config" and Path(argv[-1]).is_absolute()  # the child runs in launch.REPO_ROOT
        assert read_yaml(argv[-1])["engine"]["model"] == want
        assert read_yaml(tmp_path / "logs/e.yaml")["engine"]["model"] == want  # the run dir's record
