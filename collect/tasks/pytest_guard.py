"""The records' channel of pytest_report.py, kept inside an audit hook (PEP 578).

Standalone (stdlib; pytest and pluggy are looked at, never patched) and plain Python 3.8 syntax.
`install(key, fd, recorder_cls, signer)` adds one audit hook to this interpreter, before
collection, and no Python code can remove it. The signing key and the records descriptor live
only in its closure: no object the tests can reach (the plugin, the config, sys.modules) holds them.

  * A record is asked for with sys.audit("wharf.record", kind, ...). The hook signs and sends
    it only when the request comes from the plugin's own code, called by pluggy, called by the
    pytest function that owns that moment: wrap_session (start, finish), call_and_report
    (test: its `report` and `call` are the ones it made, for an item collected in this session,
    not changed since), the session's collection (collect). Anything else asking, the plugin
    driven through gc, the call stack, sys.modules or ctypes included, gets a tamper record.
  * It refuses, with a tamper record and a RuntimeError, the introspection those routes use
    where an audit event exists: gc object walks, other threads' frames, trace and profile
    functions, sys.monitoring callbacks, reading memory and C symbols of the interpreter through
    ctypes, opening /proc/*/mem, replacing a function's code or defaults.
  * No code the tests can replace or define runs inside the hook, so none of it finds the hook's
    frame (f_back) and the signer in its locals: every name it uses is bound at install (no
    lookup through a module attribute or builtins at call time), every object it reads is first
    checked to be of the exact type pytest made, and that type and its bases unchanged since
    install (a replaced method or an added property would run inside the hook); instance data
    is read from the instance dict, never through a property or __getattr__.

What it cannot stop (docs/judges.md): code that runs inside the hook's extent without being
called by it (a Python signal handler, a gc callback or a finalizer run by an allocation),
native code, and everything in the tests' own process that is not a record.
"""
import os
import re
import sys
import types

REFUSED = frozenset((
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
    "sys.setprofile", "sys.monitoring.register_callback", "ctypes.PyObj_FromPtr", "ctypes.string_at",
    "ctypes.wstring_at", "ctypes.cdata",
))
PROC_MEM = re.compile(r"^/proc/[^/]+/(task/[^/]+/)?mem$")
FUNCTION_FIELDS = frozenset(("__code__", "__defaults__", "__kwdefaults__"))
MAX_WALK = 32  # frames of pluggy between the plugin and pytest's call site
HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (a builtin cannot change)
_MISSING = object()


def _codes(*modules):
    """Every code object of the functions and methods the modules define (at install: before any
    code under test)."""
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


def _classes(prefixes, extra):
    """{id: (class, copy of its dict)} of every class of the modules named with `prefixes`, of
    `extra`, and of their bases (builtins aside: they cannot be changed)."""
    found = list(extra)
    for name, mod in list(sys.modules.items()):
        if mod is not None and name.split(".")[0] in prefixes:
            found += [v for v in list(vars(mod).values()) if isinstance(v, type)]
    out = {}
    for cls in found:
        for base in cls.__mro__:
            if base.__flags__ & HEAPTYPE:
                out[id(base)] = (base, dict(vars(base)))
    return out


def install(key, fd, recorder_cls, signer):
    import _pytest.main
    import _pytest.nodes
    import _pytest.reports
    import _pytest.runner
    import pluggy._callers
    import pluggy._hooks
    import pluggy._manager

    # Every name used below, bound now: a later replacement of a builtin or a module attribute
    # is never called from inside the hook.
    _type, _id, _str, _int, _bytes, _dict, _list, _tuple = type, id, str, int, bytes, dict, list, tuple
    _len, _vars, _frame_type = len, vars, types.FrameType
    dget, write, getframe, match = dict.get, os.write, sys._getframe, PROC_MEM.match
    code_of = types.FunctionType.__dict__["__code__"].__get__
    class_dict = type.__dict__["__dict__"].__get__
    class_mro = type.__dict__["__mro__"].__get__
    class_flags = type.__dict__["__flags__"].__get__
    getpid = os.getpid
    node_id_cls = getattr(_pytest.nodes, "NodeId", None)
    node_id_str = node_id_cls.__dict__["_str_cache"].__get__ if node_id_cls is not None else None
    # pytest >= 9 keeps a node's session and id in slots: read through their C descriptors
    node_slots = {name: d.__get__ for name, d in vars(_pytest.nodes.Node).items()
                  if type(d) is types.MemberDescriptorType}
    _bool, _float, _none = bool, float, type(None)

    mac = signer(key)
    mine = _codes(recorder_cls)
    relay = _codes(pluggy._callers, pluggy._hooks, pluggy._manager)
    sites = {"start": {_pytest.main.wrap_session.__code__}, "finish": {_pytest.main.wrap_session.__code__},
             "test": {_pytest.runner.call_and_report.__code__}, "collect": _codes(_pytest.main, _pytest.runner),
             "items": _codes(_pytest.main), "tamper": None}
    protected = mine | relay | _codes(_pytest.main, _pytest.runner)
    classes = {}  # taken at the session's start: pytest's own setup done, no code under test run yet
    report_cls, call_cls, session_cls = _pytest.reports.TestReport, _pytest.runner.CallInfo, _pytest.main.Session
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

    def unchanged(cls):
        """cls and its bases are pytest's, as they were at install."""
        for base in class_mro(cls):
            if not class_flags(base) & HEAPTYPE:
                continue  # a builtin: it cannot change
            kept = dget(classes, _id(base))
            if kept is None or kept[0] is not base:
                return False
            now, then = class_dict(base), kept[1]
            for name in then:
                if name not in now:
                    return False
            for name in now:
                if _type(name) is not _str:
                    return False
                value = now[name]
                if dget(then, name, _MISSING) is not value:
                    t = _type(value)  # pytest sets flags on its classes as it runs: plain data runs no code
                    if not (t is _bool or t is _int or t is _str or t is _float or t is _none):
                        return False
        return True

    def fields(obj, cls):
        """obj's instance dict when obj is exactly a `cls` (unchanged) with plain str keys, else None."""
        if _type(obj) is not cls or not unchanged(cls):
            return None
        d = _vars(obj)
        if _type(d) is not _dict:
            return None
        for name in d:
            if _type(name) is not _str:
                return None
        return d

    def node_attr(item, d, name):
        get = dget(node_slots, name)
        return get(item) if get is not None else dget(d, name)

    def id_text(nid):
        """The text of a pytest 9 NodeId (its cache, filled when pytest formatted it), or None."""
        if node_id_cls is not None and _type(nid) is node_id_cls:
            text = node_id_str(nid)
            return text if _type(text) is _str else None
        return None

    def nodeid_of(item, d):
        """An item's nodeid (pytest < 9: _nodeid; 9: its NodeId, in a slot)."""
        old = dget(d, "_nodeid")
        return old if _type(old) is _str else id_text(node_attr(item, d, "_id"))

    def call_site(frame, allowed):
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

    def test_record(site, report):
        """(nodeid, when, outcome, xfail) for call_and_report's `report`, or why it is not genuine."""
        loc = site.f_locals
        if _type(loc) is not _dict:
            return "a frame without plain locals"
        item, call = dget(loc, "item"), dget(loc, "call")
        kept = dget(st["items"], _id(item))
        if kept is None or kept[0] is not item:
            return "a report for an item this session did not collect"
        di, dr, dc = fields(item, kept[1]), fields(report, report_cls), fields(call, call_cls)
        if di is None or dr is None or dc is None:
            return "pytest's item, report or call classes changed, or not the objects pytest made"
        if dget(loc, "report") is not report or node_attr(item, di, "session") is not st["session"]:
            return "a report pytest's runner did not make"
        if dget(di, "_obj") is not kept[2] or "runtest" in di or "ihook" in di or "obj" in di:
            return "an item changed since collection"
        nodeid = dget(dr, "nodeid") if "nodeid" in dr else id_text(dget(dr, "_id"))  # pytest < 9 | 9
        when, outcome, cwhen = dget(dr, "when"), dget(dr, "outcome"), dget(dc, "when")
        if _type(nodeid) is not _str or _type(when) is not _str or _type(outcome) is not _str or _type(cwhen) is not _str \
                or nodeid != nodeid_of(item, di) or when != cwhen:
            return "a report that does not match its item"
        if when == "call" and outcome == "passed" and dget(dc, "excinfo") is not None:
            return "a passed report for a call that raised"
        return (nodeid, when, outcome, "1" if "wasxfail" in dr else "0")

    def refused(event, args):
        """Why this audit event is refused, or None (exact types only: no code of the tests runs here)."""
        if event in REFUSED:
            return event
        if event == "open" and _len(args) > 0:
            path = args[0]
            if _type(path) is _bytes:
                path = path.decode("utf-8", "replace")
            if _type(path) is _str:
                parts = []
                for part in path.split("/"):  # normpath by hand: os.path's could be replaced
                    if part == "..":
                        if parts:
                            parts.pop()
                    elif part and part != ".":
                        parts.append(part)
                clean = "/" + "/".join(parts)
                return "open " + clean if path[:1] == "/" and match(clean) is not None else None
            return None
        if event == "ctypes.dlsym" and _len(args) > 1 and _type(args[1]) is _str and args[1].lstrip("_")[:2] == "Py":
            return "ctypes.dlsym " + args[1]
        if event == "object.__setattr__" and _len(args) > 1 and _type(args[1]) is _str and args[1] in FUNCTION_FIELDS \
                and _type(args[0]) is types.FunctionType and code_of(args[0]) in protected:
            return "replacing the %s of a function of pytest, pluggy or the plugin" % args[1]
        return None

    def hook(event, args):
        if _type(event) is not _str:
            return  # the interpreter's own events are plain str; a str subclass asks for nothing
        if event != "wharf.record":
            why = refused(event, args)
            if why is not None:
                send("tamper", "refused: " + why)
                raise RuntimeError("wharf: %s is refused while the tests are graded" % why)
            return
        if _type(args) is not _tuple or _len(args) < 2 or _type(args[0]) is not _str:
            send("tamper", "a malformed record request")
            return
        kind = args[0]
        # getframe(1): the code that called sys.audit, which must be the plugin's
        site = call_site(getframe(1), sites[kind]) if kind in sites else None
        if site is None or _type(site) is not _frame_type:
            send("tamper", "a %s record asked for outside pytest's own call site" % kind[:20])
            return
        if kind == "start":
            classes.update(_classes(("_pytest", "pluggy"), (recorder_cls,)))
            session = dget(site.f_locals, "session")
            st["session"] = session if _type(session) is session_cls else None
            send("start", _str(getpid()))
        elif kind == "items":
            items = args[1] if _type(args[1]) is _list else []
            kept = {}
            for i in items:
                cls = _type(i)
                d = fields(i, cls) if _id(cls) in classes else None
                if d is not None:
                    kept[_id(i)] = (i, cls, dget(d, "_obj"))
            st["items"] = kept
        elif kind == "test":
            got = test_record(site, args[1])
            if _type(got) is _str:
                send("tamper", got)
            else:
                send("test", *got)
        elif kind == "finish" and _type(args[1]) is _int:
            send("finish", _str(args[1]))
        elif kind in ("collect", "tamper") and _type(args[1]) is _str:
            send(kind, args[1])

    sys.addaudithook(hook)
