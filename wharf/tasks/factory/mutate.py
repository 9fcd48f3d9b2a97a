"""Procedural bugs: mutations of one function's source, found and applied with `ast` (pure).

Each mutation replaces one span of the file's text (the rest stays byte for byte, so the fix is
a small patch). The operators:
  cmp_flip     a comparison turned around at its boundary: < <=, > >=, == !=, is / is not, in / not in
  bool_flip    `and` <-> `or`
  arith_swap   + <-> -, * <-> // (a binary operator)
  const_shift  an int constant n -> n + 1 (off by one), True <-> False
  slice_shift  a slice bound b -> b + 1 (off by one in a slice)
  range_shift  range(..., stop) -> range(..., stop - 1) (off by one in a range)
  negate_if    `if c:` / `while c:` / `x if c else y` -> not c (an inverted condition)
  drop_stmt    a statement removed (a call, an assignment, an augmented assignment, a guard that
               returns or raises early); `pass` takes its place where the block would be empty
  swap_args    the first two positional arguments of a call swapped
A mutation whose text does not parse, or parses to the same tree, is never offered.
"""
from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass

CMP_FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
ARITH_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult}
OPERATORS = ("cmp_flip", "bool_flip", "arith_swap", "const_shift", "slice_shift", "range_shift", "negate_if",
             "drop_stmt", "swap_args")


@dataclass(frozen=True)
class Mutation:
    file: str  # relative to the package root
    function: str  # qualname
    def_line: int  # the function's first line, as its code object reports it
    line: int  # 1-based line of the mutated node
    col: int
    operator: str
    end_line: int
    end_col: int
    replacement: str  # the text that replaces [line:col, end_line:end_col)

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}:{self.col}:{self.operator}"


def functions(tree: ast.Module) -> dict[tuple[str, int], ast.AST]:
    """(qualname, first line) -> the def node, for every function and method; the first line as
    code objects report it (a decorated function's is its first decorator's)."""
    out: dict[tuple[str, int], ast.AST] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = prefix + child.name
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                out[(q, first)] = child
                walk(child, q + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)
    walk(tree, "")
    return out


def _paren(node: ast.AST) -> str:
    return f"({ast.unparse(node)})"


def _expr_mutations(node: ast.AST) -> list[tuple[str, ast.AST, str]]:
    """(operator, node to replace, replacement text) for one expression node."""
    out = []
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in CMP_FLIP:
        out.append(("cmp_flip", node, _paren(ast.Compare(node.left, [CMP_FLIP[type(node.ops[0])]()], node.comparators))))
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        out.append(("bool_flip", node, _paren(ast.BoolOp(other, node.values))))
    elif isinstance(node, ast.BinOp) and type(node.op) in ARITH_SWAP:
        out.append(("arith_swap", node, _paren(ast.BinOp(node.left, ARITH_SWAP[type(node.op)](), node.right))))
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        out.append(("const_shift", node, repr(not node.value)))
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        out.append(("const_shift", node, repr(node.value + 1)))
    elif isinstance(node, ast.Slice):
        for bound in (node.lower, node.upper):
            if bound is not None and not isinstance(bound, ast.Constant):
                out.append(("slice_shift", bound, f"({ast.unparse(bound)} + 1)"))
    elif isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id == "range" and node.args and not node.keywords:
            stop = node.args[1] if len(node.args) > 1 else node.args[0]
            out.append(("range_shift", stop, f"({ast.unparse(stop)} - 1)"))
        pos = [a for a in node.args if not isinstance(a, ast.Starred)]
        if len(pos) == len(node.args) >= 2 and ast.dump(pos[0]) != ast.dump(pos[1]):
            swapped = ast.Call(node.func, [pos[1], pos[0], *pos[2:]], node.keywords)
            out.append(("swap_args", node, ast.unparse(swapped)))
    elif isinstance(node, ast.IfExp):
        out.append(("negate_if", node.test, f"({_negated(node.test)})"))
    return out


def _negated(test: ast.expr) -> str:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _paren(test.operand)
    return f"not ({ast.unparse(test)})"


def _stmt_mutations(stmt: ast.stmt) -> list[tuple[str, ast.AST, str]]:
    out = []
    if isinstance(stmt, (ast.If, ast.While)):
        out.append(("negate_if", stmt.test, _negated(stmt.test)))
    guard = isinstance(stmt, ast.If) and not stmt.orelse and isinstance(stmt.body[-1], (ast.Return, ast.Raise))
    if guard or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)) or \
            isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        out.append(("drop_stmt", stmt, "pass"))
    return out


def _in_fstring(func: ast.AST) -> set[int]:
    return {id(n) for j in ast.walk(func) if isinstance(j, ast.JoinedStr) for n in ast.walk(j)}


def _own_nodes(func: ast.AST):
    """The nodes of func's body, not of functions or classes nested in it (those have their own
    coverage entry), nor the docstring."""
    stack = list(reversed(func.body))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def candidates(source: str, file: str, qualname: str, first_line: int) -> list[Mutation]:
    """Every mutation of the function (qualname, first_line) of `source`, as first drawn: `finish`
    says whether one parses to a new tree and tidies its text."""
    tree = ast.parse(source)
    func = functions(tree).get((qualname, first_line))
    if func is None:
        return []
    skip = _in_fstring(func)
    lines = source.splitlines(keepends=True)
    found: list[Mutation] = []
    for node in _own_nodes(func):
        if id(node) in skip or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            continue
        muts = _stmt_mutations(node) if isinstance(node, ast.stmt) else _expr_mutations(node)
        for op, target, text in muts:
            if op == "drop_stmt" and not _own_lines(lines, target):
                continue
            found.append(Mutation(file, qualname, first_line, target.lineno, target.col_offset, op,
                                  target.end_lineno, target.end_col_offset, text))
    return found


def finish(source: str, m: Mutation) -> Mutation | None:
    """m tidied, or None when its text does not parse or parses to the same tree. Done when a
    mutation is tried, not when it is listed: each costs a parse of the whole file."""
    if not _changes_tree(ast.parse(source), source, m):
        return None
    return _tidy(source, m)


def _tidy(source: str, m: Mutation) -> Mutation:
    """m with the fewest parentheses that give the same tree: a bug reads like code a person
    wrote, not like `((a <= b))`, which would give it away."""
    want = ast.dump(ast.parse(apply(source, m)))
    text = m.replacement
    options = []
    if text.startswith("not (") and _wrapped(text[4:]):
        options.append("not " + text[5:-1])
    if _wrapped(text):
        options.append(text[1:-1])
    for option in options:
        bare = dataclasses.replace(m, replacement=option)
        try:
            if ast.dump(ast.parse(apply(source, bare))) == want:
                return bare
        except SyntaxError:
            continue
    return m


def _wrapped(text: str) -> bool:
    """text is one parenthesised group: its first "(" closes at its last character."""
    if not (text.startswith("(") and text.endswith(")")):
        return False
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return i == len(text) - 1
    return False


def _own_lines(lines: list[str], stmt: ast.stmt) -> bool:
    """The statement fills its lines alone (nothing before it, nothing but a comment after)."""
    before = lines[stmt.lineno - 1][:stmt.col_offset]
    after = lines[stmt.end_lineno - 1][stmt.end_col_offset:].strip()
    return not before.strip() and (not after or after.startswith("#"))


def apply(source: str, m: Mutation) -> str:
    lines = source.splitlines(keepends=True)
    start = sum(len(x) for x in lines[:m.line - 1]) + _byte_to_char(lines[m.line - 1], m.col)
    end = sum(len(x) for x in lines[:m.end_line - 1]) + _byte_to_char(lines[m.end_line - 1], m.end_col)
    return source[:start] + m.replacement + source[end:]


def _byte_to_char(line: str, col: int) -> int:
    """ast's col_offset counts UTF-8 bytes."""
    return len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))


def _changes_tree(tree: ast.Module, source: str, m: Mutation) -> bool:
    try:
        new = ast.parse(apply(source, m))
    except (SyntaxError, ValueError):
        return False
    return ast.dump(new) != ast.dump(tree)
