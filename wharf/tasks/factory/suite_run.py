"""Run pytest on a package's source tree and write what each test did, as JSON.

    python -I suite_run.py OUT.json SRC_ROOT COVER(0|1) -- PYTEST_ARGS...
    python -I suite_run.py --serve     (a fork server: one run per JSON line on stdin)

Standalone (stdlib + pytest; started in the package's own environment, never imported by wharf).
OUT.json: {"tests": {nodeid: {"outcome": passed|failed|skipped, "message": the failure's one-line
crash message, "funcs": [[file, qualname, first line], ...],
"foreign": its test function is not defined in its own file}}, "collect_errors": {nodeid: message}, "exitstatus": N}. With COVER=1 each
test records the functions of SRC_ROOT it ran (setup, call and teardown), via sys.monitoring:
every function start is seen once per test (the callback disables its location until the next
test restarts the events), so the cost is one call per function per test, not per line.
"""
import json
import os
import sys

import pytest

TOOL = 4  # a sys.monitoring tool id (0-5); 4 is not claimed by coverage (1) or debuggers (0)


class Recorder:
    def __init__(self, root, cover):
        self.root = os.path.realpath(root) + os.sep
        self.cover = cover
        self.tests = {}
        self.collect_errors = {}
        self.foreign = {}
        self.current = None
        self.exitstatus = None
        if cover:
            mon = sys.monitoring
            mon.use_tool_id(TOOL, "wharf-factory")
            mon.register_callback(TOOL, mon.events.PY_START, self._start)
            mon.set_events(TOOL, mon.events.PY_START)

    def _start(self, code, offset):
        if self.current is not None and code.co_filename.startswith(self.root):
            self.current.add((code.co_filename[len(self.root):], code.co_qualname, code.co_firstlineno))
        return sys.monitoring.DISABLE

    def _entry(self, nodeid):
        return self.tests.setdefault(nodeid, {"outcome": "passed", "message": "", "funcs": set()})

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        entry = self._entry(item.nodeid)
        self.current = entry["funcs"]
        if self.cover:
            sys.monitoring.restart_events()
        yield
        self.current = None

    def pytest_collection_modifyitems(self, items):
        # before any test runs: a unittest.TestCase item's _obj is still the class's function
        self.foreign.update((i.nodeid, not _defined_in(i.__dict__.get("_obj"), str(i.path))) for i in items)

    def pytest_runtest_logreport(self, report):
        entry = self._entry(report.nodeid)
        if report.failed and entry["outcome"] != "failed":
            entry["outcome"] = "failed"
            crash = getattr(report.longrepr, "reprcrash", None)
            entry["message"] = (crash.message if crash is not None else str(report.longrepr))[:2000]
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
        elif report.when == "call" and hasattr(report, "wasxfail"):
            entry["outcome"] = "skipped"  # xfail/xpass: never a spec test

    def pytest_collectreport(self, report):
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            self.collect_errors[report.nodeid] = (crash.message if crash is not None else str(report.longrepr))[-500:]

    def pytest_sessionfinish(self, session, exitstatus):
        self.exitstatus = int(exitstatus)


def _defined_in(obj, path):
    """Is obj (or a function it wraps) compiled from the file at path? The judge grades only test
    functions its run's test files define (a mixin's test from tests/__init__.py voids the run)."""
    obj = getattr(obj, "__func__", obj)
    for _ in range(8):
        code = getattr(obj, "__code__", None)
        if code is not None and os.path.realpath(code.co_filename) == os.path.realpath(path):
            return True
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            return False
        obj = getattr(obj, "__func__", obj)
    return False


def main(argv):
    out, root, cover = argv[0], argv[1], argv[2] == "1"
    args = argv[4:] if argv[3:4] == ["--"] else argv[3:]
    rec = Recorder(root, cover)
    code = pytest.main(args, plugins=[rec])
    tests = {k: {**v, "funcs": sorted(v["funcs"]), "foreign": rec.foreign.get(k, False)} for k, v in rec.tests.items()}
    with open(out, "w") as f:
        json.dump({"tests": tests, "exitstatus": int(code), "collect_errors": rec.collect_errors}, f)
    return 0


def serve():
    """A fork server for the hunt's many short runs: pytest and its own plugins are imported once
    here, and each request ({"argv": [...], "cwd": ...}, a line on stdin) runs main() in a forked
    child, so a run costs no interpreter start and no pytest import (most of a short run's CPU).
    The child's pid, then its exit status, go back as lines on stdout; nothing of the package is
    imported here, so each child imports it afresh from the workspace as it is then."""
    import importlib

    from _pytest.config import default_plugins
    for name in default_plugins:
        try:
            importlib.import_module("_pytest." + name)
        except ImportError:
            pass
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.chdir(req["cwd"])
            code = 1
            try:
                code = main(req["argv"])
            finally:
                os._exit(code)
        print(pid, flush=True)
        _, status = os.waitpid(pid, 0)
        print(status, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["--serve"] else main(sys.argv[1:]))
