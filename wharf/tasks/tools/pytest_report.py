"""Run pytest with wharf's report plugin: each test's outcome, taken from pytest's own report
hooks, sent to the grader through a channel the code under test is not told about.

    python -I pytest_report.py PYTEST_ARGS...   (started by pytest_grade.py, not by hand)

Standalone (stdlib + pytest) and plain Python 3.8 syntax (audit hooks): it may run under a task repo's own
interpreter. The grader writes one line on our stdin before anything else runs,
`wharf-report-1 KEY_HEX FD`, and closes it; we read it and put /dev/null on stdin, so the key
and the descriptor are in no argument, variable or file. Each record is one line on FD:

    SEQ KIND FIELD_HEX... MAC_HEX    MAC = HMAC-SHA256(key, "SEQ KIND FIELD_HEX...")

KIND: start (pid and sealer, c or python: before collection, so before any code under test is imported), test (nodeid,
phase, outcome, xfail 0|1: one per pytest_runtest_logreport), collect (nodeid of a collector
that failed), tamper (what of pytest's reporting machinery changed since start) and finish
(pytest's exit status, at pytest_sessionfinish). Fields are hex so that no encoder the code
under test could patch sits between what pytest reported and what is signed.

The code under test runs in this process, so the key and the descriptor are kept where no
Python object holds them: in an audit hook written in C (wharf_seal.c), which signs a record
only when pytest_decide.decide found that pytest's own call site asked the plugin for it, and
which refuses the introspection (gc walks, ctypes, /proc/self/mem, other threads' frames) that
reads around that. docs/judges.md says what is left.
"""
import hashlib
import os
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -I: our sibling
import pytest_exact  # noqa: E402
import pytest_guard  # noqa: E402

MAGIC = "wharf-report-1"
# Modules whose functions and classes decide or carry a test's outcome: a replaced one is tamper.
WATCHED = ("_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.skipping", "_pytest.main",
           "_pytest.nodes", "_pytest.outcomes", "_pytest.fixtures", "_pytest.unittest", "_pytest.capture",
           "_pytest.assertion.rewrite", "_pytest.pathlib", "pytest_exact")
# Where pytest's assertion rewriter looks for its cached bytecode of the test files: under a
# character device, so none is ever read or written (a forged .pyc of a test module is never
# loaded). Python's own cache stays: the libraries' is read-only to the tests, and the code under
# test's own is the agent's code anyway.
NO_PYCACHE = "/dev/null/wharf-no-pycache"
CALLABLE_KINDS = (types.FunctionType, types.BuiltinFunctionType, property, classmethod, staticmethod, type)


def _no_rewrite_cache():
    """pytest's rewriter reads and writes its .pyc of a file of the workspace (the tests run from
    it) nowhere (NO_PYCACHE); the installed plugins it also rewrites keep their cache (read-only to
    the tests; rewriting them all each session cost ~1.2 CPU s)."""
    import pathlib

    import _pytest.assertion.rewrite as rewrite

    original, workspace = rewrite.get_cache_dir, os.getcwd().rstrip("/") + "/"

    def get_cache_dir(file_path):
        return pathlib.Path(NO_PYCACHE) if str(file_path).startswith(workspace) else original(file_path)
    rewrite.get_cache_dir = get_cache_dir


def _read_channel():
    """(key, fd) from the line on stdin; then stdin is /dev/null."""
    data = b""
    while b"\n" not in data and len(data) < 4096:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        data += chunk
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    parts = data.decode("ascii", "replace").split()
    if len(parts) != 3 or parts[0] != MAGIC:
        sys.stderr.write("pytest_report.py: no report channel on stdin (run by pytest_grade.py)\n")
        sys.exit(3)
    fd = int(parts[2])
    os.set_inheritable(fd, False)  # processes the tests start do not get it
    return bytes.fromhex(parts[1]), fd


def _signer(key):
    """HMAC-SHA256 from two prepared hash states: the fallback sealer's (pytest_guard._python_sealer),
    where wharf_seal is not built for this interpreter."""
    block = key.ljust(64, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))
    icopy, ocopy = inner.copy, outer.copy

    def mac(msg):
        i = icopy()
        i.update(msg)
        o = ocopy()
        o.update(i.digest())
        return o.hexdigest()
    return mac


def _module_snapshot(names):
    """Every function/class/property of the named modules and of their classes, by name. The
    objects themselves are kept (not their id()), so a replaced one cannot reuse its address."""
    snap = {}
    for name in names:
        mod = sys.modules.get(name)
        for attr, value in list(vars(mod).items()) if mod is not None else ():
            if not isinstance(value, CALLABLE_KINDS):
                continue
            snap[name + "." + attr] = value
            if isinstance(value, type) and value.__module__ == name:
                for cattr, cval in list(vars(value).items()):
                    if isinstance(cval, CALLABLE_KINDS):
                        snap[name + "." + attr + "." + cattr] = cval
    return snap


def _watched():
    """The watched modules loaded now, pluggy's and this one's included."""
    return sorted(n for n in list(sys.modules)
                  if n in WATCHED or n == __name__ or n == "pluggy" or n.startswith("pluggy."))


def _test_codes(config):
    """Every code object the test files named on the command line compile to, the way pytest's
    assertion rewriter compiles them (with pytest_exact's rewrite): taken at the session's start,
    before any code under test runs, from the files as they are then (read-only to that code)."""
    from _pytest.assertion.rewrite import _rewrite_test

    out, stack, paths = set(), [], []
    for arg in config.args:  # each file once: node ids name one file many times (--only-spec)
        path = config.invocation_params.dir / str(arg).split("::")[0]
        if path not in paths:
            paths.append(path)
    for path in paths:
        if path.suffix == ".py" and path.is_file():
            stack.append(_rewrite_test(path, config)[1])
    while stack:
        code = stack.pop()
        out.add(code)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return frozenset(out)


def _interpreter_state():
    """What decides which bytecode is loaded: changed after the start, it is tamper."""
    hooks = [type(f).__name__ for f in sys.meta_path]
    first = hooks.index("AssertionRewritingHook") if "AssertionRewritingHook" in hooks else len(hooks)
    return (sys.pycache_prefix, sys.dont_write_bytecode, tuple(sys.meta_path[:first + 1]))


def _hook_snapshot(pm):
    """(hook, plugin name, function) of every registered hook implementation."""
    out = set()
    for hook_name in dir(pm.hook):
        caller = getattr(pm.hook, hook_name)
        if hook_name.startswith("_") or not hasattr(caller, "get_hookimpls"):
            continue
        for impl in caller.get_hookimpls():
            out.add((hook_name, impl.plugin_name, impl.function))
    return out


class Recorder:
    """The plugin. It holds no key and no descriptor: each record is asked of the sealer's audit
    hook (wharf_seal.c), which signs what pytest_decide.decide finds at pytest's own call sites. The checks of pytest's
    machinery run around each test."""

    def __init__(self):
        self._names = self._modules = self._hooks = self._pm = self._state = None
        self._tampered = set()

    @staticmethod
    def _send(kind, *fields, _audit=sys.audit):  # bound now: a replaced sys.audit never sees a record
        _audit("wharf.record", kind, *fields)

    def _check(self):
        if self._modules is None:
            return
        now = _module_snapshot(self._names)
        changed = sorted(k for k in set(now) | set(self._modules) if now.get(k) is not self._modules.get(k))
        hooks = _hook_snapshot(self._pm)
        conftests = {self._pm.get_name(m) for m in getattr(self._pm, "_conftest_plugins", ())}
        changed += sorted("hook %s by %s" % (h, p) for h, p, _ in hooks ^ self._hooks if p not in conftests)
        now = _interpreter_state()
        if now[0] is not self._state[0] or now[1] is not self._state[1] or len(now[2]) != len(self._state[2]) \
                or any(a is not b for a, b in zip(now[2], self._state[2])):
            changed.append("the bytecode cache or the import hooks in front of pytest's assertion rewriter")
        for what in changed:
            if what not in self._tampered:
                self._tampered.add(what)
                self._send("tamper", what)

    @pytest.hookimpl(trylast=True)  # after the fixture manager registered itself
    def pytest_sessionstart(self, session):
        self._pm = session.config.pluginmanager
        self._names = _watched()
        self._modules, self._hooks = _module_snapshot(self._names), _hook_snapshot(self._pm)
        self._state = _interpreter_state()
        self._send("start", "", _test_codes(session.config))

    def pytest_collectstart(self, collector):
        self._check()  # before each module is imported: what the previous one's imports changed

    def pytest_collectreport(self, report):
        if report.failed:
            self._send("collect", str(report.nodeid))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        self._send("items", session.items)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item):
        self._check()  # a plain hook: runs before the test body whatever wraps it

    @pytest.hookimpl(trylast=True)  # what the report says after every other plugin saw it
    def pytest_runtest_logreport(self, report):
        self._check()
        self._send("test", report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        self._check()
        self._send("finish", int(exitstatus))


def main(argv):
    key, fd = _read_channel()
    sys.dont_write_bytecode = True
    _no_rewrite_cache()
    pytest_exact.install()  # assert x == <literal>: compared by value, not by x's __eq__
    pytest_guard.install(key, fd, Recorder, _signer)  # before collection: before any code under test
    del key
    os.write(1, b"wharf-report-1 ready\n")  # report_records.READY: the environment started us
    return pytest.main(argv, plugins=[Recorder()])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
