"""The red team's leak check: an attacker's printed output must hold nothing of tests/ or
solution/ (the sandbox never shows them to an agent)."""
from __future__ import annotations

from pathlib import Path

from wharf.tasks.check.records import Trial

MIN_LINE = 16  # shorter lines (`import os`, `}`) are too common to mean a leak


def secret_lines(task: Path) -> set[str]:
    """The distinctive lines of the task's tests/ and solution/ files that environment/ lacks."""
    seen = {ln.strip() for p in (task / "environment").rglob("*") if p.is_file()
            for ln in p.read_text(errors="replace").splitlines()}
    out = set()
    for d in ("tests", "solution"):
        for p in (task / d).rglob("*") if (task / d).is_dir() else ():
            if p.is_file():
                out |= {s for ln in p.read_text(errors="replace").splitlines()
                        if len(s := ln.strip()) >= MIN_LINE and s not in seen and not s.startswith("#")}
    return out


def leak_reasons(task: Path, trials: list[Trial]) -> list[str]:
    lines = secret_lines(task)
    out = []
    for t in trials:
        hit = next((s for s in sorted(lines) if s in t.output), None)
        if hit:
            out.append(f"attacker {t.change} printed a line of tests/ or solution/: {hit[:80]!r}")
    return out
