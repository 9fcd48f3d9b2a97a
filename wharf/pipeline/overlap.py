"""Rounds that overlap (`loop.max_staleness` = s >= 1): round j's collect starts as soon as
policy-v<j-s> is published, sampling from the newest policy published then, while the loop
converts and trains the rounds before it.

    s = 1      time ->
    collect    | r0 (base) | r1 (base)              | r2 (policy-v1)         | r3 (policy-v2) ...
    train      |           | convert+train r0 -> v1 | convert+train r1 -> v2 | convert+train r2 ...

Round j trains from policy-v<j>, so its rows are at most s policies behind (the round's lag,
j - the version that sampled it). The trainer corrects for it with the stored behaviour
log-probs (train.mismatch=tis: the PPO ratio is taken to the trainer's start policy, and each
token is weighted by exp(start - behaviour), capped); a round whose rows are further behind is
refused before it trains (`check_lag`).

A collector thread runs the rounds' collects one at a time, in order, each as a child process
(`python -m wharf.collect`, its log in rounds/<j>/collect/logs/loop-collect.log) in a session of its
own, so that stopping the loop stops the collect and everything it started. A collect killed
mid-round resumes on the next run with the policy it started with (its manifest names it),
keeping its finished rollouts; its marker says which policy sampled it, its lag and how long it
waited for that policy.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import Counter
from typing import Callable

from wharf.collect.node import free_port
from wharf.core import procs, storage
from wharf.core.config import RunConfig
from wharf.core.errors import WharfError
from wharf.core.layout import RoundLayout, policy_name, policy_version

from .stages import LoopError, read_marker, write_marker

log = logging.getLogger("wharf.loop")


class StaleRowsError(WharfError, RuntimeError):
    """A round holds rows sampled by a policy more than loop.max_staleness versions behind."""


def allowed_policies(k: int, s: int, base: str, tag: str | None = None) -> tuple[str, ...]:
    """The policies that may sample round k: policy-v<k> and the s before it (v0: the base), named
    with the run's `tag` (wharf/core/names.py)."""
    return tuple(base if v == 0 else policy_name(v, tag) for v in range(max(0, k - s), k + 1))


def lags(policies: Counter, k: int, base: str) -> dict[str, int | None]:
    """Each policy that sampled round k's rows -> how many versions it is behind policy-v<k> (the
    one round k trains from); None for a name that is no policy version (the rows are the run's own:
    any run tag counts, wharf/core/names.py)."""
    return {p: None if (v := policy_version(p, base)) is None else k - v for p in policies}


def _outside(lag: int | None, s: int) -> bool:
    """Whether a lag is one loop.max_staleness=s does not allow (None: no policy of this run; < 0:
    a policy newer than the one trained, i.e. a mixed-up run dir)."""
    return lag is None or not 0 <= lag <= s


def _behind(lag: int | None) -> str:
    return "not a policy of this run" if lag is None else f"{lag} behind"


def check_lag(policies: Counter, k: int, s: int, base: str, source: str) -> dict[str, int]:
    """Round k's lag per policy; raises naming the rows sampled more than `s` versions behind."""
    lag = lags(policies, k, base)
    bad = {p: n for p, n in policies.items() if _outside(lag[p], s)}
    if bad:
        what = "; ".join(f"{n} rollouts by {p} ({_behind(lag[p])})" for p, n in sorted(bad.items(), key=lambda pn: str(pn[0])))
        raise StaleRowsError(
            f"round {k} trains from {f'policy-v{k}' if k else base} on rows at most {s} policies behind "
            f"(loop.max_staleness={s}), but {source} holds {what}. Delete rounds/{k}/ to collect it again, "
            f"or raise loop.max_staleness")
    return {p: int(v) for p, v in lag.items()}


def recorded_policy(cfg: RunConfig, k: int) -> str | None:
    """The name round k's collect sampled policy-v<k> under when it started (its marker or manifest):
    a round from before per-run names keeps `policy-v<k>`; None when it has not started."""
    rnd = cfg.layout.round(k)
    name = (read_marker(rnd, "collect") or round_manifest(rnd)).get("policy")
    return name if policy_version(name, cfg.start_policy) == k else None


def served_name(cfg: RunConfig, k: int) -> str:
    """The name round k samples policy-v<k> under: the round's own (a round started before per-run
    names resumes with `policy-v<k>`), else the run's (cfg.policy)."""
    asked = cfg.collect.policy
    return asked if asked and policy_version(asked) == k else cfg.policy(k)


class Published:
    """The newest published policy version (0: the base model); the collector waits on it."""

    def __init__(self, version: int = 0):
        self.version = version
        self._cond = threading.Condition()

    def set(self, version: int) -> None:
        with self._cond:
            self.version = max(self.version, version)
            self._cond.notify_all()

    def wait(self, version: int, stop: threading.Event) -> float:
        """Block until policy-v<version> (or a newer one) is published; the seconds waited."""
        t0 = time.monotonic()
        with self._cond:
            while self.version < version and not stop.is_set():
                self._cond.wait(0.5)
        return time.monotonic() - t0


@dataclasses.dataclass
class Collected:
    """What the collector leaves the loop for round k (its collect marker holds the same)."""

    policy: str
    lag: int
    waited_s: float  # the collect waited this long for its policy to be published


def round_manifest(rnd: RoundLayout) -> dict:
    """Round rnd's collect manifest ({} before the collect wrote one); in a run in object storage
    the bucket's (a loop resumed on another machine: its collect's policy is there)."""
    storage.pull_file(rnd.collect.manifest)
    try:
        return json.loads(rnd.collect.manifest.read_text())
    except (OSError, ValueError):
        return {}


class Collector:
    """`with Collector(cfg, round_cfg, serve) as c:` rounds 0..cfg.rounds-1 collected in a thread,
    in order, each once its policy is published (`c.published.set(v)`); `c.wait(k)` blocks until
    round k is collected. `round_cfg(k, policy)` is round k's config; `serve(cfg, version)` makes
    sure the endpoint serves that policy."""

    def __init__(self, cfg: RunConfig, round_cfg: Callable[[int, str], RunConfig],
                 serve: Callable[[RunConfig, int], None]):
        self.cfg, self.round_cfg, self.serve = cfg, round_cfg, serve
        self.published = Published()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._done: dict[int, Collected] = {}
        self._error: BaseException | None = None
        self._child = None
        self._thread = threading.Thread(target=self._run, name="wharf-collector", daemon=True)

    def __enter__(self) -> "Collector":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._child is not None:
            procs.stop(self._child)  # a collect cut here resumes on the next run
        self._thread.join()

    def wait(self, k: int) -> tuple[Collected, float]:
        """Round k's collect, and the seconds the caller waited for it."""
        t0 = time.monotonic()
        with self._cond:
            while k not in self._done and self._error is None:
                self._cond.wait(0.5)
            if k in self._done:
                return self._done[k], time.monotonic() - t0
            raise self._error

    def _run(self) -> None:
        try:
            for j in range(self.cfg.rounds):
                got = self._collect(j)
                if got is None:
                    return  # stopped
                with self._cond:
                    self._done[j] = got
                    self._cond.notify_all()
        except BaseException as e:  # handed to the main thread, which raises it
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _collect(self, j: int) -> Collected | None:
        rnd, base, s = self.cfg.layout.round(j), self.cfg.start_policy, self.cfg.loop.max_staleness
        tag = self.cfg.layout.tag
        marker = read_marker(rnd, "collect")
        if marker is not None:
            lag = j - (policy_version(marker.get("policy"), base) or 0)
            return Collected(marker.get("policy") or base, marker.get("lag", lag), marker.get("waited_s", 0.0))
        policy, waited = round_manifest(rnd).get("policy"), 0.0  # a killed collect resumes with its policy
        if policy is None:
            waited = self.published.wait(j - s, self._stop)
            if self._stop.is_set():
                return None
            v = self.published.version
            policy = base if v == 0 else policy_name(v, tag)
        lag = lags(Counter({policy: 1}), j, base)[policy]
        if _outside(lag, s):
            raise StaleRowsError(f"round {j}'s collect was started from {policy} ({rnd.collect.manifest}), "
                                 f"{_behind(lag)}{'' if lag is None else f' policy-v{j}'}; "
                                 f"loop.max_staleness={s} allows {s}. Delete {rnd.root} to collect it again, "
                                 "or raise loop.max_staleness")
        rcfg = self.round_cfg(j, policy)
        self.serve(rcfg, j - lag)
        log.info("round %d: collecting from %s (lag %d, waited %.0f s for it) beside the trainer; its log: %s",
                 j, policy, lag, waited, rnd.collect.logs / "loop-collect.log")
        t0 = time.monotonic()
        if not self._child_collect(rcfg):
            return None
        m = round_manifest(rnd)
        info = {"rollouts": (m.get("counts") or {}).get("finished"), "mean_reward": m.get("mean_reward")}
        log.info("round %d: collected %s rollouts in %.0f s, mean reward %s", j, info.get("rollouts"),
                 time.monotonic() - t0, info.get("mean_reward"))
        write_marker(rnd, "collect", time.monotonic() - t0, policy=policy, **info, lag=lag, waited_s=round(waited, 1))
        return Collected(policy, lag, waited)

    def _child_collect(self, rcfg: RunConfig) -> bool:
        """Round rcfg.round's collect in a child process; False when stopped."""
        paths = rcfg.round_layout.collect
        paths.logs.mkdir(parents=True, exist_ok=True)
        # its own proxy port: the loop's evaluations use proxy.port meanwhile; never an endpoint of its own
        ccfg = dataclasses.replace(rcfg, endpoint=dataclasses.replace(rcfg.endpoint, launch=False),
                                   proxy=dataclasses.replace(rcfg.proxy, port=free_port(rcfg.proxy.host)))
        log = paths.logs / "loop-collect.log"
        self._child = procs.spawn(procs.stage_argv("wharf.collect", ccfg, paths.config), log)
        while self._child.poll() is None:
            if self._stop.wait(0.5):
                return False
        rc, self._child = self._child.returncode, None
        if rc != 0:
            tail = log.read_text(errors="replace")[-1500:] if log.is_file() else ""
            raise LoopError(f"round {rcfg.round}'s collect (from {rcfg.collect.policy}) exited with status {rc}; "
                            f"its log: {log}. Run the loop again to resume it. Last lines:\n{tail}")
        return True

