"""`assert a == b` in the test files, compared so that an object the code under test returns
cannot simply say yes: where one side is a plain builtin value (an int, a str, a list of them,
...), the other side is read as the builtin value it holds, not through its own `__eq__`.

Standalone (stdlib; pytest's assertion rewriter is wrapped, not changed) and plain Python 3.8
syntax; installed by pytest_report.py before collection. Every `==` with a single operator
that is an assert's test (or an operand of its `and`, `or`, `not`) becomes
`@pytest_ar._wharf_exact_eq(a, b)`:
  * both or neither side plain: `a == b`, as written;
  * the other side an instance of a builtin type (an `int` subclass, a `float` subclass such as
    numpy.float64, a `str` subclass, a list, dict, tuple or set subclass): its builtin value,
    read through the builtin type's own methods (int.__int__, str.__str__, list.copy, ...), is
    compared, so an overridden `__eq__`, `__iter__` or `__int__` never runs;
  * the other side of an unrelated type (numpy.int64, Fraction, an object of the code under
    test): `a == b`, and if it is true the same object is asked whether it also equals a
    different plain value drawn at random (the literal plus a random number, a longer string
    or list): an object equal to both is equal to everything, and the assertion fails.
What is left: an object that reads the expected value from the test's frame or source and says
yes to it alone, a truthy object where the test asserts only truth (`assert f()`), `!=`, `<`.
"""
import ast
import random
import sys

NAME = "_wharf_exact_eq"
SCALARS = (bool, int, float, complex, str, bytes, type(None))
_MAX_DEPTH = 64


def _plain(x, depth=0, _type=type, _scalars=SCALARS, _list=list, _tuple=tuple, _dict=dict, _set=set,
           _frozenset=frozenset):
    """Whether x is a plain value: an exact builtin scalar, or an exact list/tuple/dict/set of them."""
    t = _type(x)
    if t in _scalars:
        return True
    if depth > _MAX_DEPTH:
        return False
    if t is _list or t is _tuple or t is _set or t is _frozenset:
        return all(_plain(v, depth + 1) for v in x)
    if t is _dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in _dict.items(x))
    return False


_MISSING = object()
_BASES = ((bool, bool), (int, int.__int__), (float, float.__float__), (complex, complex.__complex__),
          (str, str.__str__), (bytes, bytes.__bytes__))


def _builtin_value(x, depth=0, _isinstance=isinstance, missing=_MISSING, bases=_BASES, _list=list, _tuple=tuple,
                   _dict=dict, _set=set, _frozenset=frozenset, _type=type):
    """x as the builtin value it holds, read through the builtin types' own methods, or _MISSING
    when x (or something in it) is not an instance of a builtin type."""
    if depth > _MAX_DEPTH:
        return missing
    for base, read in bases:
        if _type(x) is base:
            return x
        if _isinstance(x, base) and base is not bool:
            return read(x)
    if x is None:
        return None
    if _isinstance(x, _list) or _isinstance(x, _tuple):
        items = _list.copy(x) if _isinstance(x, _list) else _tuple.__getitem__(x, slice(None))
        out = [_builtin_value(v, depth + 1) for v in items]
        if any(v is missing for v in out):
            return missing
        return out if _isinstance(x, _list) else _tuple(out)
    if _isinstance(x, _dict):
        pairs = [(_builtin_value(k, depth + 1), _builtin_value(v, depth + 1)) for k, v in _dict.items(_dict.copy(x))]
        if any(k is missing or v is missing for k, v in pairs):
            return missing
        return _dict(pairs)
    if _isinstance(x, _set) or _isinstance(x, _frozenset):
        items = [_builtin_value(v, depth + 1) for v in (_set.copy(x) if _isinstance(x, _set) else _frozenset.copy(x))]
        if any(v is missing for v in items):
            return missing
        return _set(items) if _isinstance(x, _set) else _frozenset(items)
    return missing


def _other_than(value, _type=type, _randint=random.SystemRandom().randint):
    """A plain value of the same kind as `value` that is certainly not equal to it."""
    t, n = _type(value), _randint(1, 1 << 30)
    if t is bool:
        return not value
    if t in (int, float, complex):
        return value + n if value == value else 0  # (NaN: 0)
    if t is str:
        return value + "\0wharf%d" % n
    if t is bytes:
        return value + b"\0wharf%d" % n
    if t is list:
        return value + [object()]
    if t is tuple:
        return value + (object(),)
    if t is dict:
        return {**value, object(): n}
    if t is set or t is frozenset:
        return t(value) | {object()}
    return object()


def _truthy(x):
    try:
        return bool(x)
    except Exception:  # noqa: BLE001 - numpy arrays: no single truth, not a yes
        return False


def _generic(other, value, truthy=_truthy, other_than=_other_than):
    """other == value for an object of an unrelated type: true only if it is not also equal to a
    different plain value (then it is equal to everything)."""
    return truthy(other == value) and not truthy(other == other_than(value))


def _matches(other, value, depth=0, _type=type, _isinstance=isinstance, _len=len, _zip=zip, _list=list,
             _tuple=tuple, _dict=dict, scalars=SCALARS, missing=_MISSING, builtin_value=_builtin_value,
             generic=_generic):
    """other == value, `value` plain: container by container, element by element, each element
    read as its builtin value where it is an instance of a builtin type."""
    t = _type(value)
    if t in scalars or depth > _MAX_DEPTH:
        held = builtin_value(other, _MAX_DEPTH)  # a scalar: no descent
        return held == value if held is not missing else generic(other, value)
    if (t is _list or t is _tuple) and _isinstance(other, t):
        items = _list.copy(other) if t is _list else _tuple.__getitem__(other, slice(None))
        return _len(items) == _len(value) and all(_matches(o, v, depth + 1) for o, v in _zip(items, value))
    if t is _dict and _isinstance(other, _dict):
        pairs = _dict.items(_dict.copy(other))
        keys = {builtin_value(k): v for k, v in pairs if builtin_value(k) is not missing}
        if _len(keys) != _len(pairs) or set(keys) != set(value):
            return False
        return all(_matches(keys[k], value[k], depth + 1) for k in value)
    held = builtin_value(other, depth)
    return held == value if held is not missing else generic(other, value)


def exact_eq(a, b, _plain=_plain, matches=_matches):
    """a == b, as the module doc says."""
    pa, pb = _plain(a), _plain(b)
    if pa == pb:
        return a == b
    return matches(b, a) if pa else matches(a, b)


class _EqRewriter(ast.NodeTransformer):
    """`a == b` (one operator) as an assert's test, or an operand of its `and`, `or` or `not` ->
    @pytest_ar._wharf_exact_eq(a, b). An `==` inside a call, an attribute or a subscript
    (`(arr == [1, 2]).all()`) keeps its own value: numpy's elementwise comparison."""

    def visit_Assert(self, node):
        node.test = self._rewrite(node.test)
        return node

    def _rewrite(self, test):
        if isinstance(test, ast.BoolOp):
            test.values = [self._rewrite(v) for v in test.values]
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test.operand = self._rewrite(test.operand)
        elif isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            func = ast.Attribute(ast.Name("@pytest_ar", ast.Load()), NAME, ast.Load())
            return ast.copy_location(ast.Call(func, [test.left, test.comparators[0]], []), test)
        return test


def install():
    """Wrap pytest's rewrite_asserts so that test files are compiled with the rewrite above."""
    import _pytest.assertion.rewrite as rewrite

    original = rewrite.rewrite_asserts
    setattr(rewrite, NAME, exact_eq)

    def rewrite_asserts(mod, source, module_path=None, config=None):
        if b"PYTEST_DONT_REWRITE" not in source:  # pytest adds no @pytest_ar there
            _EqRewriter().visit(mod)
        return original(mod, source, module_path, config)
    rewrite.rewrite_asserts = rewrite_asserts
    sys.modules.setdefault("pytest_exact", sys.modules[__name__])
