"""What the oracle changes, read off its diff: the files, and in Python files the functions whose
lines it touches (the function(s) under test, which the audit's exploits go after)."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

_FILE = re.compile(r"^diff --git a/(.+?) b/(.+)$")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


@dataclass(frozen=True)
class Function:
    """A function (or method: `Class.name`) of a file, with the lines its body spans."""

    qualname: str
    body_start: int  # first line of the body (after a docstring)
    body_end: int
    indent: str  # the body's indentation


@dataclass
class Target:
    """The oracle's change in one file of the workspace: the functions it touches there."""

    path: str  # relative to the workdir
    functions: list[Function] = field(default_factory=list)
    created: bool = False  # the file is new: the oracle made it


def changed_lines(diff: str) -> dict[str, set[int]]:
    """{path: the old file's lines a `git diff -U0` touches} (a pure insertion after line n
    counts as touching n and n + 1); a new file maps to an empty set, a deleted file is left out."""
    out: dict[str, set[int]] = {}
    path = None
    for line in diff.splitlines():
        m = _FILE.match(line)
        if m:
            path = m.group(2)
            out[path] = set()
        elif line.startswith("+++ ") and line[4:] == "/dev/null" and path is not None:
            out.pop(path, None)  # deleted: nothing to go after
            path = None
        elif path is not None and (h := _HUNK.match(line)):
            start, count = int(h.group(1)), int(h.group(2) if h.group(2) is not None else 1)
            out[path] |= set(range(start, start + count)) if count else {start, start + 1}
    return out


def _functions(tree: ast.Module) -> list[tuple[ast.AST, str]]:
    found: list[tuple[ast.AST, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((child, prefix + child.name))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
    visit(tree, "")
    return found


def _function(node: ast.FunctionDef, qualname: str, lines: list[str]) -> Function | None:
    body = node.body
    if (len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        body = body[1:]  # keep the docstring
    first = body[0]
    if first.lineno == node.lineno:  # `def f(): return x` on one line: no body of its own to replace
        return None
    text = lines[first.lineno - 1]
    return Function(qualname, first.lineno, node.end_lineno, text[: len(text) - len(text.lstrip())])


def touched_functions(source: str, touched: set[int]) -> list[Function]:
    """The innermost functions of `source` whose lines meet `touched`."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines()
    hits = [(n, q) for n, q in _functions(tree) if touched & set(range(n.lineno, n.end_lineno + 1))]
    inner = [(n, q) for n, q in hits if not any(o is not n and o.lineno >= n.lineno and o.end_lineno <= n.end_lineno
                                                 for o, _ in hits)]
    return [f for n, q in inner if (f := _function(n, q, lines)) is not None]


def targets(diff: str, workspace: Path) -> list[Target]:
    """The oracle's targets in `workspace` (the task's environment/), from its `git diff -U0`."""
    out = []
    for path, touched in sorted(changed_lines(diff).items()):
        src = workspace / path
        if not src.is_file():
            out.append(Target(path, created=True))
            continue
        funcs = touched_functions(src.read_text(errors="replace"), touched) if path.endswith(".py") else []
        out.append(Target(path, funcs))
    return out
