"""A manifest hunted under an older judge, brought up to the judge as it is now without hunting
again (its bugs, and so its task ids, stay): the tests its specs name run once more on the
pristine source under the judge (judged.py, as a hunt's baseline does), and the ones the judge
does not report PASSED leave every spec. A bug left with no FAIL_TO_PASS test is dropped.

    python -m wharf.tasks.factory.rejudge datasets/real/manifests/NAME-VERSION.seedS.json...

Why: the judge grew stricter after the first manifests were hunted (gc.get_objects and ctypes
refused, test functions compared with the pristine files'); a spec naming a test the judge now
voids makes a task whose oracle can never score 1.0. One line per manifest; the file is
rewritten only when something changed, with `rejudged` in its stats."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from . import judged, make, suite
from .package import FactoryError
from .verify import judge_digest


def prune(manifest: dict, passing: set[str]) -> tuple[int, int]:
    """Drop from each bug's spec the tests not in `passing`, and the bugs left with no
    FAIL_TO_PASS test; (bugs dropped, spec entries dropped). Pure: edits `manifest` in place."""
    kept, entries = [], 0
    for bug in manifest["bugs"]:
        f2p = [t for t in bug["FAIL_TO_PASS"] if t in passing]
        p2p = [t for t in bug["PASS_TO_PASS"] if t in passing]
        entries += len(bug["FAIL_TO_PASS"]) + len(bug["PASS_TO_PASS"]) - len(f2p) - len(p2p)
        if not f2p:
            continue
        if len(f2p) < len(bug["FAIL_TO_PASS"]) or len(p2p) < len(bug["PASS_TO_PASS"]):
            bug.pop("checked", None)  # its spec changed: checked again before it counts as checked
        bug.update(FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p,
                   messages={t: m for t, m in bug.get("messages", {}).items() if t in f2p})
        kept.append(bug)
    dropped = len(manifest["bugs"]) - len(kept)
    manifest["bugs"] = kept
    return dropped, entries


def rejudge(path: Path) -> str:
    m = json.loads(path.read_text())
    spec = f"{m['package']}=={m['version']}"
    pkg = make.prepare(make.Entry(spec, list(m.get("deps", [])), list(m.get("args", []))), lambda s: None, m.get("env"))
    named = sorted({t for b in m["bugs"] for t in b["FAIL_TO_PASS"] + b["PASS_TO_PASS"]})
    with tempfile.TemporaryDirectory(prefix="wharf-rejudge-") as tmp:
        work = suite.working_copy(pkg, Path(tmp))
        passing = set(judged.passing_under_judge(pkg, work, named, suite.pytest_options(pkg, str(work)),
                                                 max(600.0, 10 * m.get("suite_seconds", 60))))
    before = len(m["bugs"])
    dropped, entries = prune(m, passing)
    line = (f"{spec}: {len(named) - len(passing & set(named))} of {len(named)} named tests not passed by the judge; "
            f"{entries} spec entries and {dropped} of {before} bugs dropped")
    if entries:
        m["stats"]["rejudged"] = {"judge": judge_digest(), "bugs_dropped": dropped, "entries_dropped": entries}
        path.write_text(json.dumps(m, indent=1) + "\n")
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wharf.tasks.factory.rejudge", description=__doc__.split("\n")[0])
    ap.add_argument("manifests", nargs="+", type=Path)
    bad = 0
    for path in ap.parse_args(argv).manifests:
        try:
            print(rejudge(path), flush=True)
        except (FactoryError, OSError, ValueError, KeyError) as e:
            print(f"{path}: {e}", file=sys.stderr)
            bad += 1
    return 2 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
