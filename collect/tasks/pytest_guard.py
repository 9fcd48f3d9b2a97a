"""The records' channel of pytest_report.py, kept inside an audit hook (PEP 578).

Standalone (stdlib; pytest and pluggy are looked at, never patched) and plain Python 3.8 syntax.
`install(key, fd, recorder_cls)` adds one audit hook to this interpreter, before collection,
and no Python code can remove it. The signing key and the records descriptor live only in its
closure: no object the tests can reach (the plugin, the config, sys.modules) holds them.

  * A record is asked for with sys.audit("wharf.record", kind, ...). The hook signs and sends
    it only when the request comes from the plugin's own code, called by pluggy, called by the
    pytest function that owns that moment: wrap_session (start, finish), call_and_report
    (test: its `report` and `call` are the ones it made, for an item collected in this session,
    not changed since), the session's collection (collect). Anything else asking, the plugin
    driven through gc, the call stack, sys.modules or ctypes included, gets a tamper record.
  * It refuses, with a tamper record and a RuntimeError, the introspection those routes use
    where an audit event exists: gc object walks, other threads' frames, trace and profile
    functions, sys.monitoring callbacks, reading memory and C symbols of the interpreter through
    ctypes, opening /proc/*/mem, replacing a function's code.

What it cannot refuse (no audit event): a frame's f_back and f_locals, a function's closure.
They lead to the plugin, which no longer signs for anyone but pytest's own call sites.
"""
import os
import re
import sys

REFUSED = frozenset((
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
    "sys.setprofile", "sys.monitoring.register_callback", "ctypes.PyObj_FromPtr", "ctypes.string_at",
    "ctypes.wstring_at", "ctypes.cdata",
))
PROC_MEM = re.compile(r"^/proc/[^/]+/(task/[^/]+/)?mem$")
MAX_WALK = 32  # frames of pluggy between the plugin and pytest's call site


def _refused(event, args, protected):
    """Why this audit event is refused, or None (plain types only: no code of the tests runs here)."""
    if event in REFUSED:
        return event
    if event == "open" and args and type(args[0]) in (str, bytes):
        path = args[0] if type(args[0]) is str else args[0].decode("utf-8", "replace")
        return "open " + path if PROC_MEM.match(os.path.normpath(path)) else None
    if event == "ctypes.dlsym" and len(args) > 1 and type(args[1]) is str and args[1].lstrip("_").startswith("Py"):
        return "ctypes.dlsym " + args[1]
    if event == "object.__setattr__" and len(args) > 1 and args[1] == "__code__" \
            and getattr(args[0], "__code__", None) in protected:
        return "replacing the code of pytest's, pluggy's or the plugin's %s" % getattr(args[0], "__name__", "?")
    return None


def _codes(*modules):
    """Every code object of the functions and methods the modules define."""
    out = set()
    for mod in modules:
        for value in list(vars(mod).values()):
            for fn in [value] + (list(vars(value).values()) if isinstance(value, type) else []):
                fn = getattr(fn, "__func__", fn)
                fn = getattr(fn, "fget", fn)
                code = getattr(fn, "__code__", None)
                if code is not None:
                    out.add(code)
    return frozenset(out)


def call_site(frame, mine, relay, allowed):
    """The pytest frame that called pluggy, which called the plugin's `frame`; None when the
    plugin did not ask, or was not called from one of the `allowed` code objects (None: any)."""
    if frame.f_code not in mine:
        return None
    frame = frame.f_back
    while frame is not None and frame.f_code in mine:  # the plugin's own helpers
        frame = frame.f_back
    for _ in range(MAX_WALK):
        if frame is None or frame.f_code not in relay:
            break
        frame = frame.f_back
    return frame if frame is not None and (allowed is None or frame.f_code in allowed) else None


def why_not_genuine(site, report, items, session, classes):
    """Why call_and_report's frame `site` does not vouch for `report`, or None."""
    report_cls, call_cls = classes
    loc = site.f_locals
    item, call = loc.get("item"), loc.get("call")
    kept = items.get(id(item))
    if kept is None or kept[0] is not item or type(item) is not kept[1] or type(report) is not report_cls:
        return "a report for an item this session did not collect"
    if loc.get("report") is not report or type(call) is not call_cls or item.session is not session:
        return "a report pytest's runner did not make"
    if getattr(item, "obj", None) is not kept[2] or any(k in vars(item) for k in ("runtest", "ihook", "obj")):
        return "an item changed since collection"
    if type(report.nodeid) is not str or report.nodeid != item.nodeid or report.when != call.when:
        return "a report that does not match its item"
    if report.when == "call" and report.outcome == "passed" and call.excinfo is not None:
        return "a passed report for a call that raised"
    return None


def install(key, fd, recorder_cls, signer):
    import _pytest.main
    import _pytest.reports
    import _pytest.runner
    import pluggy._callers
    import pluggy._hooks
    import pluggy._manager

    mac, write, getframe = signer(key), os.write, sys._getframe
    mine = _codes(recorder_cls)
    relay = _codes(pluggy._callers, pluggy._hooks, pluggy._manager)
    sites = {"start": {_pytest.main.wrap_session.__code__}, "finish": {_pytest.main.wrap_session.__code__},
             "test": {_pytest.runner.call_and_report.__code__}, "collect": _codes(_pytest.main, _pytest.runner),
             "items": _codes(_pytest.main), "tamper": None}
    protected = mine | relay | _codes(_pytest.main, _pytest.runner)
    classes, session_cls = (_pytest.reports.TestReport, _pytest.runner.CallInfo), _pytest.main.Session
    st = {"seq": 0, "session": None, "items": {}}

    def send(kind, *fields):
        body = "%d %s %s" % (st["seq"], kind, " ".join(f.encode("utf-8").hex() or "-" for f in fields))
        line = (body + " " + mac(body.encode("ascii")) + "\n").encode("ascii")
        st["seq"] += 1
        try:
            while line:
                line = line[write(fd, line):]
        except OSError:
            pass  # the grader is gone or the descriptor was closed: records missing, a failure

    def hook(event, args):
        if event != "wharf.record":
            why = _refused(event, args, protected)
            if why is not None:
                send("tamper", "refused: " + why)
                raise RuntimeError("wharf: %s is refused while the tests are graded" % why)
            return
        kind = args[0] if len(args) > 1 and type(args[0]) is str else ""
        # getframe(1): the code that called sys.audit, which must be the plugin's
        site = call_site(getframe(1), mine, relay, sites[kind]) if kind in sites else None
        if site is None:
            send("tamper", "a %s record asked for outside pytest's own call site" % kind[:20])
            return
        if kind == "start":
            session = site.f_locals.get("session")
            st["session"] = session if type(session) is session_cls else None
            send("start", str(os.getpid()))
        elif kind == "items":
            st["items"] = {id(i): (i, type(i), getattr(i, "obj", None)) for i in list(args[1])}
        elif kind == "test":
            report = args[1]
            why = why_not_genuine(site, report, st["items"], st["session"], classes)
            if why:
                send("tamper", why)
            else:
                send("test", report.nodeid, str(report.when), str(report.outcome),
                     "1" if hasattr(report, "wasxfail") else "0")
        elif kind == "finish":
            send("finish", str(int(args[1])))
        elif kind in ("collect", "tamper") and type(args[1]) is str:
            send(kind, args[1])

    sys.addaudithook(hook)
