"""What the pytest records say: `decide`, which the sealer (pytest_guard.py) asks for every audit
event it watches (PEP 578), and whose answer it signs.

Standalone (stdlib only) and plain Python 3.8 syntax; loaded by pytest_guard before collection.

  * A record is asked for with sys.audit("wharf.record", kind, ...). decide gives it only when
    the request comes from the plugin's own code, called by pluggy, called by the pytest
    function that owns that moment: wrap_session (start, finish), call_and_report (test: its
    `report` and `call` are the ones it made, for an item collected in this session, not changed
    since), the session's collection (collect). Anything else asking gets a tamper record.
  * It refuses, with a tamper record and a RuntimeError, the introspection that reads around
    that where an audit event exists: gc object walks, other threads' frames, trace and profile
    functions, sys.monitoring callbacks, memory and C symbols of the interpreter through ctypes,
    /proc/*/mem, replacing the code or defaults of a function of pytest, pluggy or this module.
  * Every name the functions below use is a parameter bound when they are defined (no global or
    builtin looked up at call time), every object read is first checked to be of the exact type
    pytest made, that type and its bases unchanged since the session's start; instance data is
    read from the instance dict, never through a property or __getattr__.
"""
import os
import re
import sys
import types

REFUSED = frozenset((
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
    "sys.setprofile", "sys.monitoring.register_callback", "ctypes.PyObj_FromPtr", "ctypes.string_at",
    "ctypes.wstring_at", "ctypes.cdata",
    # tampering, whatever it is for: a second audit hook, a call into native code through ctypes
    # (memmove over the sealer's memory), a symbol looked up, a buffer over raw memory
    "sys.addaudithook", "ctypes.call_function", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata/buffer",
))
# ctypes and cffi: with them Python code reads and writes raw memory and calls C without any
# audit event (ctypes.memmove raises none). Refused as an ImportError: code that treats them as
# optional (numpy) goes on without them.
REFUSED_IMPORTS = frozenset(("ctypes", "_ctypes", "cffi", "_cffi_backend"))
PROC_MEM = re.compile(r"^/proc/[^/]+/(task/[^/]+/)?mem$")
FUNCTION_FIELDS = frozenset(("__code__", "__defaults__", "__kwdefaults__"))
MAX_WALK = 32  # frames of pluggy between the plugin and pytest's call site
HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (a builtin cannot change)
_MISSING = object()


def _classes(prefixes, extra):
    """{id: (class, read-only copy of its dict)}, read-only, of every class of the modules named with `prefixes`, of
    `extra`, and of their bases (builtins aside: they cannot be changed)."""
    found = list(extra)
    for name, mod in list(sys.modules.items()):
        if mod is not None and name.split(".")[0] in prefixes:
            found += [v for v in list(vars(mod).values()) if isinstance(v, type)]
    out = {}
    for cls in found:
        for base in cls.__mro__:
            if base.__flags__ & HEAPTYPE:
                out[id(base)] = (base, types.MappingProxyType(dict(vars(base))))
    return types.MappingProxyType(out)





# ---- decide and its helpers: everything they use is a parameter bound here, at definition ----
# ctx (built by install, a tuple, nothing in it mutable):
#   0 mine, 1 relay, 3 protected: code objects (frozensets); 2 sites: kind -> {call site's code: its globals}
#   4 TestReport, 5 CallInfo, 6 Session: pytest's classes; 7 node_slots: Node's slot readers
#   8 (NodeId, its text reader) on pytest >= 9, else (None, None); 9 the plugin's class; 10 the sealer
# state (kept by the sealer, replaced only by what decide returns): (session, items, classes, codes):
#   items: id -> (item, its class, its _obj, the test function, its code, its globals, defined by a pristine
#   test file); codes: every code object the pristine test files compile to (the plugin's, at the start)


def _unchanged(cls, classes, _type=type, _id=id, _str=str, _bool=bool, _int=int, _float=float,
               _none=type(None), dget=dict.get, pget=types.MappingProxyType.get, missing=_MISSING,
               class_dict=type.__dict__["__dict__"].__get__, class_mro=type.__dict__["__mro__"].__get__,
               class_flags=type.__dict__["__flags__"].__get__, heaptype=HEAPTYPE):
    """cls and its bases are pytest's, as they were at the session's start."""
    for base in class_mro(cls):
        if not class_flags(base) & heaptype:
            continue  # a builtin: it cannot change
        kept = pget(classes, _id(base))
        if kept is None or kept[0] is not base:
            return False
        now, then = class_dict(base), kept[1]
        for name in now:
            if _type(name) is not _str:
                return False
        for name in then:
            if name not in now:
                return False
        for name in now:
            value = now[name]
            if pget(then, name, missing) is not value:
                t = _type(value)  # pytest sets flags on its classes as it runs: plain data runs no code
                if not (t is _bool or t is _int or t is _str or t is _float or t is _none):
                    return False
    return True


def _fields(obj, cls, classes, _type=type, _vars=vars, _dict=dict, _str=str, unchanged=_unchanged):
    """obj's instance dict when obj is exactly a `cls` (unchanged) with plain str keys, else None."""
    if _type(obj) is not cls or not unchanged(cls, classes):
        return None
    d = _vars(obj)
    if _type(d) is not _dict:
        return None
    for name in d:
        if _type(name) is not _str:
            return None
    return d


def _node_attr(item, d, name, node_slots, dget=dict.get, pget=types.MappingProxyType.get):
    """pytest >= 9 keeps a node's session and id in slots (read through their C descriptors)."""
    get = pget(node_slots, name)
    return get(item) if get is not None else dget(d, name)


def _id_text(nid, node_id, _type=type, _str=str):
    """The text of a pytest 9 NodeId (its cache, filled when pytest formatted it), or None."""
    if node_id[0] is not None and _type(nid) is node_id[0]:
        text = node_id[1](nid)
        return text if _type(text) is _str else None
    return None


def _nodeid_of(item, d, c, _type=type, _str=str, dget=dict.get, node_attr=_node_attr, id_text=_id_text):
    """An item's nodeid (pytest < 9: _nodeid; 9: its NodeId, in a slot)."""
    old = dget(d, "_nodeid")
    return old if _type(old) is _str else id_text(node_attr(item, d, "_id", c[7]), c[8])


def _call_site(frame, allowed, mine, relay, _range=range, max_walk=MAX_WALK, pget=types.MappingProxyType.get):
    """The pytest frame that called pluggy, which called the plugin's `frame`; None when the
    plugin did not ask, or was not called from one of the `allowed` code objects (None: any) run
    with its own module's globals (the same code in a function made with other globals, whose
    CallInfo never runs the test, is not pytest's call site)."""
    if frame is None or frame.f_code not in mine:
        return None
    frame = frame.f_back
    while frame is not None and frame.f_code in mine:  # the plugin's own helpers
        frame = frame.f_back
    for _ in _range(max_walk):
        if frame is None or frame.f_code not in relay:
            break
        frame = frame.f_back
    if frame is None or (allowed is not None and pget(allowed, frame.f_code) is not frame.f_globals):
        return None
    return frame


def _same_obj(o, kept, _type=type, method_type=types.MethodType, func_of=types.MethodType.__dict__["__func__"].__get__,
              name_of=type.__dict__["__name__"].__get__):
    """The item's object is the one collected; for a unittest.TestCase test, pytest itself binds it
    to a fresh instance at setup and drops it at teardown: that bound method of the same pristine
    function, or None, is no change (whose code and globals are checked on their own)."""
    if o is kept[2]:
        return True
    if name_of(kept[1]) != "TestCaseFunction":
        return False
    return o is None or (_type(o) is method_type and kept[3] is not None and func_of(o) is kept[3])


def _test_record(site, report, c, state, _type=type, _id=id, _str=str, _dict=dict, dget=dict.get,
                 pget=types.MappingProxyType.get, fields=_fields, node_attr=_node_attr, id_text=_id_text,
                 nodeid_of=_nodeid_of, code_of=types.FunctionType.__dict__["__code__"].__get__,
                 globals_of=types.FunctionType.__dict__["__globals__"].__get__, same_obj=_same_obj):
    """(nodeid, when, outcome, xfail) for call_and_report's `report`, or why it is not genuine."""
    session, items, classes, _ = state
    loc = site.f_locals
    if _type(loc) is not _dict:
        return "a frame without plain locals"
    item, call = dget(loc, "item"), dget(loc, "call")
    kept = pget(items, _id(item))
    if kept is None or kept[0] is not item:
        return "a report for an item this session did not collect"
    di, dr, dc = fields(item, kept[1], classes), fields(report, c[4], classes), fields(call, c[5], classes)
    if di is None or dr is None or dc is None:
        return "pytest's item, report or call classes changed, or not the objects pytest made"
    if dget(loc, "report") is not report or node_attr(item, di, "session", c[7]) is not session:
        return "a report pytest's runner did not make"
    if not same_obj(dget(di, "_obj"), kept) or "runtest" in di or "ihook" in di or "obj" in di:
        return "an item changed since collection"
    if not kept[6]:
        return "a test function the pristine test files do not define (changed before collection)"
    if kept[3] is not None and (code_of(kept[3]) is not kept[4] or globals_of(kept[3]) is not kept[5]):
        return "a test function's code or globals changed since collection"
    nodeid = dget(dr, "nodeid") if "nodeid" in dr else id_text(dget(dr, "_id"), c[8])  # pytest < 9 | 9
    when, outcome, cwhen = dget(dr, "when"), dget(dr, "outcome"), dget(dc, "when")
    if _type(nodeid) is not _str or _type(when) is not _str or _type(outcome) is not _str or _type(cwhen) is not _str \
            or nodeid != nodeid_of(item, di, c) or when != cwhen:
        return "a report that does not match its item"
    if when == "call" and outcome == "passed" and dget(dc, "excinfo") is not None:
        return "a passed report for a call that raised"
    return (nodeid, when, outcome, "1" if "wasxfail" in dr else "0")


def _normalised(path):
    """os.path.normpath of an absolute path, by hand (os.path's could be replaced)."""
    parts = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part and part != ".":
            parts.append(part)
    return "/" + "/".join(parts)


def _refused(event, args, protected, _type=type, _len=len, _str=str, _bytes=bytes, refused=REFUSED,
             refused_imports=REFUSED_IMPORTS,
             match=PROC_MEM.match, normalised=_normalised, function_fields=FUNCTION_FIELDS,
             function_type=types.FunctionType, code_of=types.FunctionType.__dict__["__code__"].__get__):
    """Why this audit event is refused, or None (exact types only)."""
    if event in refused:
        return event
    if event == "open" and _len(args) > 0:
        path = args[0]
        if _type(path) is _bytes:
            path = path.decode("utf-8", "replace")
        if _type(path) is _str and path[:1] == "/" and match(normalised(path)) is not None:
            return "open " + normalised(path)
        return None
    if event == "ctypes.dlopen" and _len(args) > 0 and args[0] is not None:  # None: `import ctypes` itself
        return "ctypes.dlopen of a library"
    if event == "import" and _len(args) > 0 and _type(args[0]) is _str and args[0] in refused_imports:
        return "import " + args[0]
    if event == "object.__setattr__" and _len(args) > 1 and _type(args[1]) is _str and args[1] in function_fields \
            and _type(args[0]) is function_type and code_of(args[0]) in protected:
        return "replacing the %s of a function of pytest, pluggy or the plugin" % args[1]
    return None


def _start(c, state, site, args, _type=type, _str=str, _len=len, _frozenset=frozenset, dget=dict.get,
           getpid=os.getpid, classes_of=_classes):
    """The session's start: pytest's classes as they are now (no code under test has run yet), and
    the code objects the pristine test files compile to (args[2], the plugin's)."""
    if state[0] is not None:
        return None, ("tamper", "a second start"), None
    session = dget(site.f_locals, "session")
    if _type(session) is not c[6]:
        return None, ("tamper", "a start without pytest's session"), None
    classes = classes_of(("_pytest", "pluggy"), (c[9],))
    codes = args[2] if _len(args) > 2 and _type(args[2]) is _frozenset else _frozenset()
    return (session, state[1], classes, codes), ("start", _str(getpid()), c[10]), None


def _test_function(obj, codes, _type=type, _range=range, dget=dict.get, function_type=types.FunctionType,
                   method_type=types.MethodType, func_of=types.MethodType.__dict__["__func__"].__get__,
                   code_of=types.FunctionType.__dict__["__code__"].__get__,
                   globals_of=types.FunctionType.__dict__["__globals__"].__get__,
                   fdict=types.FunctionType.__dict__["__dict__"].__get__):
    """(function, code, globals, defined by a pristine test file) for an item's object: the function
    itself or one it wraps (__wrapped__: mock.patch, functools.wraps) compiles from a test file."""
    if _type(obj) is method_type:
        obj = func_of(obj)
    if _type(obj) is not function_type:
        return None, None, None, not codes
    fn = obj
    for _ in _range(8):
        if code_of(fn) in codes:
            return obj, code_of(obj), globals_of(obj), True
        fn = dget(fdict(fn), "__wrapped__")
        if _type(fn) is method_type:
            fn = func_of(fn)
        if _type(fn) is not function_type:
            break
    return obj, code_of(obj), globals_of(obj), not codes


def _items(c, state, items, _type=type, _id=id, _list=list, dget=dict.get, pget=types.MappingProxyType.get,
           fields=_fields, proxy=types.MappingProxyType, test_function=_test_function):
    """The session's collected items, kept read-only: (item, class, object, test function, its code,
    its globals, genuine) by id."""
    kept = {}
    for i in (items if _type(items) is _list else ()):
        cls = _type(i)
        d = fields(i, cls, state[2]) if pget(state[2], _id(cls)) is not None else None
        if d is not None:
            obj = dget(d, "_obj")
            kept[_id(i)] = (i, cls, obj) + test_function(obj, state[3])
    return (state[0], proxy(kept), state[2], state[3]), None, None


def _record(c, state, args, frame, _type=type, _len=len, _str=str, _int=int, _tuple=tuple, pget=types.MappingProxyType.get,
            call_site=_call_site, test_record=_test_record, start=_start, items=_items, frame_type=types.FrameType):
    """decide's answer to sys.audit("wharf.record", kind, ...)."""
    if _type(args) is not _tuple or _len(args) < 2 or _type(args[0]) is not _str:
        return None, ("tamper", "a malformed record request"), None
    kind = args[0]
    allowed = pget(c[2], kind, False)
    site = call_site(frame, allowed, c[0], c[1]) if allowed is not False else None
    if site is None or _type(site) is not frame_type:
        return None, ("tamper", "a %s record asked for outside pytest's own call site" % kind[:20]), None
    if kind == "start":
        return start(c, state, site, args)
    if state[0] is None:
        return None, ("tamper", "a %s record before the start" % kind), None
    if kind == "items":
        return items(c, state, args[1])
    if kind == "test":
        got = test_record(site, args[1], c, state)
        return None, (("tamper", got) if _type(got) is _str else ("test",) + got), None
    if kind == "finish" and _type(args[1]) is _int:
        return None, ("finish", _str(args[1])), None
    if kind in ("collect", "tamper") and _type(args[1]) is _str:
        return None, (kind, args[1]), None
    return None


def decide(c, state, event, args, frame, _type=type, _str=str, record=_record, refused=_refused):
    """The sealer's question for one audit event: None (nothing to do), or (new state or None,
    record to sign or None, refusal or None). `frame` is the code that raised the event."""
    if _type(event) is not _str:
        return None
    if event == "wharf.record":
        return record(c, state, args, frame)
    why = refused(event, args, c[3])
    if why is None:
        return None
    if why[:7] == "import ":  # ctypes, cffi: not there (ImportError); loading them anyway is tamper (the sealer's poll)
        return None, None, why
    return None, ("tamper", "refused: " + why), why


SEALED = (_unchanged, _fields, _node_attr, _id_text, _nodeid_of, _call_site, _test_record, _normalised, _refused,
          _start, _test_function, _items, _record, decide)  # run inside the sealer's hook: no global looked up at call time
EMPTY = types.MappingProxyType({})
INITIAL = (None, EMPTY, EMPTY, frozenset())  # the state before the session's start
