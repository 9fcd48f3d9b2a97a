"""The agent's change to the task repo, as the verifier gets it (pure functions).

In the spirit of SWE-bench's evaluation of a model patch: the verifier never runs in the tree
the agent left. It gets a clean copy of the task's environment/ with the agent's changes laid
over it, minus everything that decides how tests run or what they are:
  * test files: a file named like one in the task's tests/ dir, test_*.py, *_test.py, and any
    file under a tests/ or test/ dir (kept as shipped, or absent);
  * test configuration: conftest.py, pytest.ini, tox.ini, setup.cfg, pyproject.toml,
    sitecustomize.py, usercustomize.py, any *.pth, bytecode (__pycache__, *.pyc);
  * new top-level modules that would shadow the grader's own (pytest.py, json/, ...);
  * git metadata, and anything but regular files (a hardlink, or a symlink to a file of the
    workdir, arrives as a copy of the file it names; other links are set aside).
Each set-aside path is reported with why.
"""
from __future__ import annotations

import io
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

CONFIG_NAMES = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
                "sitecustomize.py", "usercustomize.py"}
TEST_DIRS = {"tests", "test", "testing"}
GRADER_MODULES = {"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "swebench"}
BUILD_FILES = {"Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"}

Tree = dict[str, tuple[bytes, bool] | None]  # relative path -> (content, executable), None: a dir


@dataclass
class Merge:
    tree: Tree
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    set_aside: dict[str, str] = field(default_factory=dict)  # path -> why


def shadowed_modules() -> set[str]:
    return set(sys.stdlib_module_names) | GRADER_MODULES


def why_protected(rel: str, test_names: set[str], shadow: set[str], new: bool) -> str | None:
    p = PurePosixPath(rel)
    name = p.name
    if p.parts[0] == ".git":
        return "git metadata"
    if name in CONFIG_NAMES or name.endswith(".pth"):
        return "test configuration"
    if "__pycache__" in p.parts or name.endswith((".pyc", ".pyo")):
        return "bytecode"
    if name in test_names or (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py"):
        return "test file"
    if any(part in TEST_DIRS for part in p.parts[:-1]):
        return "under a test dir"
    top = p.parts[0].removesuffix(".py")
    if new and top in shadow and (len(p.parts) > 1 or name.endswith(".py")):
        return f"shadows the grader's module {top!r}"
    return None


def read_dir(root: Path) -> Tree:
    """A host dir the project ships (trusted): its regular files, build files and bytecode left out
    (pip compiles the .py files of the tasks an install carries: no trial should start with them)."""
    tree: Tree = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink() or path.name in BUILD_FILES or why_protected(rel, set(), set(), False) == "bytecode":
            continue
        if path.is_dir():
            tree[rel] = None
        elif path.is_file():
            tree[rel] = (path.read_bytes(), bool(path.stat().st_mode & 0o111))
    return tree


def read_tar(data: bytes) -> tuple[Tree, list[str]]:
    """A tar of the agent's workdir: its regular files, and the paths of everything else. A
    hardlink is the file it links (tar stores the second name as a link to the first), a symlink
    to a regular file of the workdir is a copy of that file; a symlink leading out of the workdir,
    to a dir or nowhere, and any other kind of file, is listed in the paths of everything else."""
    tree: Tree = {}
    other: list[str] = []
    links: dict[str, str] = {}  # symlink path -> its target, resolved once every file is read
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        for m in tf:
            rel = PurePosixPath(m.name.removeprefix("./") or ".")
            if rel.as_posix() == "." or ".." in rel.parts or rel.is_absolute():
                continue
            if m.isfile() or m.islnk():  # extractfile reads a hardlink's target for us
                try:
                    target = tf.getmember(m.linkname) if m.islnk() else m
                    tree[rel.as_posix()] = (tf.extractfile(m).read(), bool(target.mode & 0o111))
                except (KeyError, tarfile.TarError, AttributeError):
                    other.append(rel.as_posix())
            elif m.isdir():
                tree[rel.as_posix()] = None
            elif m.issym():
                links[rel.as_posix()] = m.linkname
            else:
                other.append(rel.as_posix())
    for rel, target in links.items():
        found = _follow(rel, links, tree)
        if found is None:
            other.append(rel)
        else:
            tree[rel] = tree[found]
    return tree, sorted(other)


def _follow(rel: str, links: dict[str, str], tree: Tree) -> str | None:
    """The regular file of `tree` the symlink `rel` leads to, inside the workdir, or None."""
    for _ in range(40):  # the kernel's own limit on a chain of links
        target = links[rel]
        parts: list[str] = []
        for part in (PurePosixPath(rel).parent / target).parts if not target.startswith("/") else ("/",):
            if part == "/":
                return None  # absolute: it leaves the workdir (or means another tree)
            if part == "..":
                if not parts:
                    return None
                parts.pop()
            elif part not in (".", ""):
                parts.append(part)
        rel = "/".join(parts)
        if rel in links:
            continue
        return rel if tree.get(rel) is not None else None
    return None


def merge(pristine: Tree, agent: Tree, others: list[str], test_names: set[str]) -> Merge:
    """pristine + the agent's allowed changes (see the module doc)."""
    shadow = shadowed_modules()
    out = Merge(tree=dict(pristine))
    for rel in others:
        out.set_aside[rel] = "not a regular file"
    for rel, item in agent.items():
        if rel in pristine and pristine[rel] == item:
            continue
        if PurePosixPath(rel).parts[0] == ".git":
            out.set_aside[".git"] = "git metadata"
            continue
        why = why_protected(rel, test_names, shadow, new=rel not in pristine)
        if why:
            out.set_aside[rel] = why
        else:
            out.tree[rel] = item
            if item is not None:  # a new dir is listed by what is in it
                out.changed.append(rel)
    for rel in pristine:
        if rel not in agent and PurePosixPath(rel).parts[0] != ".git":  # shipped git metadata stays
            why = why_protected(rel, test_names, shadow, new=False)
            if why:
                out.set_aside[rel] = f"deleted, restored: {why}"
            else:
                del out.tree[rel]
                if pristine[rel] is not None:
                    out.deleted.append(rel)
    return out


def write_tar(tree: Tree) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for rel, item in sorted(tree.items()):
            info = tarfile.TarInfo(rel)
            if item is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(info)
                continue
            data, executable = item
            info.size, info.mode = len(data), 0o755 if executable else 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()
