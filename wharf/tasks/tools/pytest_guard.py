"""The sealer of the pytest records: it signs what `decide` (pytest_decide.py) finds at pytest's own
call sites (PEP 578 audit events).

Standalone (stdlib; pytest and pluggy are looked at, never patched) and plain Python 3.8 syntax.
`install(key, fd, recorder_cls)` is called once, before collection. It hands the key and the
records descriptor to the sealer, an audit hook written in C (wharf_seal.c, built by `make
setup`) that keeps them in its own memory and signs; what a record says is decided by
`decide` (pytest_decide.py), which the sealer calls for the events it watches and whose answer
it signs. No Python object holds the key, the descriptor or a function that signs: code of the tests that
finds decide's frame (a signal handler, a gc callback, a replaced builtin run inside it) finds
read-only tables, and the state decide keeps is held by the sealer, handed back read-only.

Where the sealer is not built for the interpreter that runs the tests (a task's own Python),
the same decide runs under a sealer in Python (`_python_sealer`), whose key a signal handler can
reach: the start record says which sealer signed (reward.json's `sealed`). docs/judges.md says
what in-process code can still do.
"""
import os
import sys
import types

from pytest_decide import INITIAL, SEALED, decide  # our sibling (pytest_report.py puts it on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
# The events the C sealer hands decide (wharf_seal.c's EVENTS): the fallback looks for tampering at the same.
WATCHED_EVENTS = frozenset((
    "wharf.record", "open", "ctypes.dlsym", "object.__setattr__", "ctypes.dlopen", "import",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
    "sys.setprofile", "sys.monitoring.register_callback", "ctypes.PyObj_FromPtr", "ctypes.string_at",
    "ctypes.wstring_at", "ctypes.cdata", "sys.addaudithook", "ctypes.call_function", "ctypes.dlsym/handle",
    "ctypes.cdata/buffer"))


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


def native_prefixes(here):
    """(bad, ok): where native code may not be loaded from (where the code under test can write,
    but the workspace: a task's own extensions live there) and the exceptions (the interpreters'
    prefixes, these tools)."""
    bad = ("/tmp/", "/dev/", "/memfd:", "/proc/", "/var/tmp/", "/run/")
    ok = {os.path.realpath(p) + "/" for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, here)}
    return bad, tuple(sorted(ok))


def _python_watch(prefixes):
    """The fallback sealer's look for what no audit event announces (wharf_seal.c's `tampering`):
    a Python signal handler, an interval timer, a shared object from a bad place. Returns
    (start, check): start() takes the session's state, check(maps) says what changed or None
    (maps: /proc/self/maps read too, at records only: it costs a file read)."""
    import signal as signal_module
    sigs = [s for s in range(1, signal_module.NSIG) if s != signal_module.SIGINT]  # asyncio.run sets SIGINT's
    getsignal, getitimer = signal_module.getsignal, signal_module.getitimer
    timers = (signal_module.ITIMER_REAL, signal_module.ITIMER_VIRTUAL, signal_module.ITIMER_PROF)
    then = {}

    def state():
        out = {}
        for s in sigs:
            try:
                out[s] = getsignal(s)
            except (ValueError, OSError):
                pass
        return out

    def start():
        then.update(state())

    def check(maps):
        now = state()
        if any(now[s] is not then.get(s) for s in now):
            return "a signal handler installed while the tests ran"
        if any(getitimer(t) != (0.0, 0.0) for t in timers):
            return "an interval timer armed while the tests ran"
        if not maps:
            return None
        try:
            with open("/proc/self/maps") as f:
                paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) > 5}
        except OSError:
            return None
        bad, ok = prefixes
        if any("/_ctypes." in p or "/_cffi_backend." in p or (p.startswith(bad) and not p.startswith(ok))
               for p in paths if p.endswith((".so", "(deleted)")) or ".so." in p):
            return "native code loaded: ctypes, cffi, or a shared object from a place the code under test can write"
        return None
    return start, check


def _python_sealer(key, fd, ctx, signer, prefixes):
    """The fallback where wharf_seal is not built for this interpreter: the same decide, signed in
    Python. Its key is in this closure, which a signal handler run inside the hook can reach."""
    mac, st, write, getframe, ask = signer(key), [INITIAL, 0, False, False], os.write, sys._getframe, decide
    watch_start, tampering = _python_watch(prefixes)

    def send(rec):
        body = "%d %s %s" % (st[1], rec[0], " ".join(f.encode("utf-8").hex() or "-" for f in rec[1:]))
        line = (body + " " + mac(body.encode("ascii")) + "\n").encode("ascii")
        st[1] += 1
        try:
            while line:
                line = line[write(fd, line):]
        except OSError:
            pass

    def hook(event, args):
        if event == "wharf.record" and not st[2]:
            watch_start()
            st[2] = True
        elif st[2] and not st[3] and event in WATCHED_EVENTS:
            why = tampering(event == "wharf.record")
            if why is not None:
                st[3] = True
                send(("tamper", why))
        frame = getframe(1) if event == "wharf.record" else None  # (sys._getframe is an audit event too)
        got = ask(ctx, st[0], event, args, frame)
        if got is not None:
            if got[0] is not None:
                st[0] = got[0]
            if got[1] is not None:
                send(got[1])
            if got[2] is not None:  # an import refused reads as a module not there (wharf_seal.c's apply)
                kind = ImportError if got[2].startswith("import ") else RuntimeError
                raise kind("wharf: %s is refused while the tests are graded" % got[2])
    sys.addaudithook(hook)


def _context(recorder_cls, sealer):
    """ctx: the code objects of the call sites and of what relays to them, pytest's classes,
    taken now, before any code under test."""
    import _pytest.main
    import _pytest.nodes
    import _pytest.reports
    import _pytest.runner
    import pluggy._callers
    import pluggy._hooks
    import pluggy._manager

    mine = _codes(recorder_cls)
    relay = _codes(pluggy._callers, pluggy._hooks, pluggy._manager)
    def run_by(module, codes):  # {code: the globals it must run with}, read-only
        return types.MappingProxyType({code: vars(module) for code in codes})
    session_site = run_by(_pytest.main, (_pytest.main.wrap_session.__code__,))
    collect = {**run_by(_pytest.main, _codes(_pytest.main)), **run_by(_pytest.runner, _codes(_pytest.runner))}
    sites = types.MappingProxyType({
        "start": session_site, "finish": session_site,
        "test": run_by(_pytest.runner, (_pytest.runner.call_and_report.__code__,)),
        "collect": types.MappingProxyType(collect), "items": run_by(_pytest.main, _codes(_pytest.main)), "tamper": None})
    ours = frozenset(f.__code__ for f in SEALED)
    protected = mine | relay | ours | _codes(_pytest.main, _pytest.runner)
    node_id = getattr(_pytest.nodes, "NodeId", None)
    node_slots = types.MappingProxyType({name: d.__get__ for name, d in vars(_pytest.nodes.Node).items()
                                         if type(d) is types.MemberDescriptorType})
    return (mine, relay, sites, protected, _pytest.reports.TestReport, _pytest.runner.CallInfo, _pytest.main.Session,
            node_slots, (node_id, node_id.__dict__["_str_cache"].__get__) if node_id else (None, None),
            recorder_cls, sealer)


def install(key, fd, recorder_cls, signer):
    """Seal the records of this session: the C sealer when it is built for this interpreter, else
    the one in Python (`signer(key)` -> mac function). Returns which: "c" or "python"."""
    try:
        import wharf_seal
    except ImportError:
        wharf_seal = None
    prefixes = native_prefixes(HERE)
    if wharf_seal is not None:
        wharf_seal.install(key, fd, decide, _context(recorder_cls, "c"), INITIAL, prefixes)
        return "c"
    _python_sealer(key, fd, _context(recorder_cls, "python"), signer, prefixes)
    return "python"
