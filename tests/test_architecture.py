"""The plan of the house, checked on the source: one import package, `wharf`, whose shared floor
(wharf.core) imports no stage; the three stages (wharf.collect, wharf.convert, wharf.train) and the
local engine (wharf.engine) stand side by side on it and import no other stage (the engine only
the core; of the stages only collect names it); what a task is and how it is decided (wharf.tasks:
the graders, the task formats) stands on the core too, used by collect; the orchestration (wharf.pipeline) stands above
them; and no module imports, at any depth (function-local imports included), a module that imports
it back. A module started by name as a child process (`"-m", X` in a list, `stage_argv(X, ...)`)
counts as imported: it must exist and obey the same rules. Also: replay loads neither collect nor
harbor, and nothing of ours is a top-level name besides `wharf` (`import train` is not ours)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("wharf", "testing")  # the top-level import names whose modules are checked
# What each room may import of ours (besides itself).
ALLOWED = {
    "wharf": set(),  # wharf/__init__.py: the version, nothing else
    "wharf.core": set(),
    "wharf.engine": {"wharf.core"},
    "wharf.tasks": {"wharf.core"},  # what a task is and how it is decided: the graders, the formats
    "wharf.collect": {"wharf.core", "wharf.engine", "wharf.tasks"},  # it starts the engine when nothing answers
    "wharf.convert": {"wharf.core"},
    "wharf.train": {"wharf.core"},
    "wharf.pipeline": {"wharf.core", "wharf.engine", "wharf.tasks", "wharf.collect", "wharf.convert", "wharf.train",
                       "testing"},
    # wharf/api.py: the stages as Python functions, above everything; nothing of ours imports it
    "wharf.api": {"wharf.core", "wharf.collect", "wharf.convert", "wharf.train", "wharf.pipeline"},
    "testing": {"wharf.core", "wharf.engine", "wharf.tasks", "wharf.collect"},  # testing: agents-check's stub
}


def _room(mod: str) -> str:
    """The room a module stands in: wharf.<room>, or the top-level name (testing, wharf itself)."""
    parts = mod.split(".")
    return ".".join(parts[:2]) if parts[0] == "wharf" and len(parts) > 1 else parts[0]


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Calls whose first argument names a module to run as `python -m` (wharf.procs.stage_argv).
MODULE_RUNNERS = {"stage_argv"}


def _run_targets(node: ast.AST) -> list[str]:
    """The modules `node` names to run as `python -m X`: "-m", "X" in a list or tuple literal, or
    a string first argument of a MODULE_RUNNERS call."""
    if isinstance(node, (ast.List, ast.Tuple)):
        elts = node.elts
        return [b.value for a, b in zip(elts, elts[1:]) if isinstance(a, ast.Constant) and a.value == "-m"
                and isinstance(b, ast.Constant) and isinstance(b.value, str)]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        return [node.args[0].value] if name in MODULE_RUNNERS else []
    return []


def _run_targets_of(path: Path) -> set[str]:
    return {t for node in ast.walk(ast.parse(path.read_text())) for t in _run_targets(node)
            if t.split(".")[0] in PACKAGES}


def _imports(path: Path, mod: str | None = None) -> set[str]:
    """Every module of ours `path` (module `mod`) imports, anywhere in the file (relative imports
    resolved), and every module of ours it runs as `python -m`."""
    mod = mod or _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n.split(".")[0] in PACKAGES}
    return out | _run_targets_of(path)


def _modules() -> dict[str, Path]:
    # node_modules: the agent CLIs' npm packages (gemini-cli's node-pty ships Python 2 scripts), not ours
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py") if "node_modules" not in p.parts]
    return {_module(p): p for p in files}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for m, p in mods.items():
        # `from a.b import c`: c is a module when a/b/c.py exists, else a name in a.b
        graph[m] = {n if n in mods else n.rpartition(".")[0] for n in _imports(p)} - {m}
        graph[m] = {n for n in graph[m] if n in mods}
    return graph


def test_each_package_imports_only_the_floors_below_it():
    bad = [f"{m} imports {n}" for m, deps in _graph().items() for n in deps
           if _room(n) != _room(m) and _room(n) not in ALLOWED[_room(m)]]
    assert not bad, "\n".join(sorted(bad))


def test_no_circles():
    graph = _graph()
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    # a package's __init__ naming its own submodules is no circle of behaviour
    circles = [c for c in sccs if len(c) > 1 and not all(m.startswith(min(c, key=len)) for m in c)]
    assert not circles, circles


def test_the_checker_sees_function_local_and_relative_imports(tmp_path):
    f = tmp_path / "probe.py"
    f.write_text("def f():\n    from wharf.collect.runner import run\n    from ..core import layout\n")
    assert _imports(f, "wharf.train.probe") == {"wharf.collect.runner", "wharf.collect.runner.run", "wharf.core",
                                                "wharf.core.layout"}


def test_every_module_run_by_name_exists():
    """A `python -m X` target of ours is a module, or a package with a __main__: a rename that
    missed a string fails here, not when a run starts the child."""
    mods = _modules()
    targets = {(t, m) for m, p in mods.items() for t in _run_targets_of(p)}
    assert ("wharf.engine", "wharf.engine.launch") in targets  # the checker sees the launcher's target
    missing = [f"{m} runs `python -m {t}`, which does not exist" for t, m in sorted(targets)
               if not (f"{t}.__main__" in mods or (t in mods and not mods[t].name == "__init__.py"))]
    assert not missing, "\n".join(missing)


def test_the_checker_sees_modules_run_by_name(tmp_path):
    f = tmp_path / "probe.py"
    f.write_text('import sys\ncmd = [sys.executable, "-m", "wharf.engine", "--port", "1"]\n'
                 'argv = procs.stage_argv("wharf.collect.proxy", cfg, path)\nother = ["-m", "pytest"]\n')
    assert _imports(f, "wharf.probe") == {"wharf.engine", "wharf.collect.proxy"}


def test_replay_loads_neither_collect_nor_harbor():
    code = ("import sys; import wharf.pipeline.replay, wharf.pipeline.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'harbor' or m.startswith('wharf.collect')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_test_doubles_are_not_in_the_installed_package():
    import tomllib

    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert not any(pat.startswith("testing") for pat in found["include"]), found
    assert found["include"] == ["wharf*"], found


def test_nothing_of_ours_is_a_top_level_name_but_wharf():
    """`pip install` adds one name: a user's own `train` or `engine` module stays theirs."""
    tops = {p.name for p in REPO.iterdir() if (p / "__init__.py").exists()}
    assert tops - {"testing", "tests", "bench"} == {"wharf"}, tops
