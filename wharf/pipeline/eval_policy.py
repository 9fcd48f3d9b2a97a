"""`wharf eval`'s policies: a spec (`base`, `<run dir>:<k>`, an adapter dir) resolved to the
weights it names, the folder its trials go to (named by the weights), and the name it is served
under (named by the weights and by the eval job that loads it)."""
from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from wharf.core import storage
from wharf.core.config import RunConfig, check_policy_spec
from wharf.core.errors import WharfError
from wharf.core.layout import RunLayout, has_adapter, policy_name
from wharf.core.names import weights_digest


class EvalError(WharfError, RuntimeError):
    """A policy that cannot be resolved or served; the message names the key and the path."""


@dataclass(frozen=True)
class Policy:
    spec: str  # as written in eval.policies
    label: str  # its folder under the eval dir
    adapter: Path | None  # None: the base model
    round: int | None = None  # k of a run round's policy-v<k> (0: base)
    sha256: str | None = None  # of the adapter's weights, taken once when resolved (None: not yet)

    @property
    def digest(self) -> str:
        """The adapter's weights' sha256 prefix: what tells two adapters apart."""
        return (self.sha256 or weights_digest(self.adapter) or "")[:12]

    def served_name(self, base: str, owner: str = "") -> str:
        """The model name to sample: the base's, or `eval-<weights>-<owner>`: named by the adapter's
        weights (a different adapter never reuses a name) and by the eval job that loads it
        (`owner`): each eval unloads only what it loaded, never a copy another eval samples."""
        return base if self.adapter is None else "-".join(filter(None, ("eval", self.digest, owner)))


def served_digest(name: str | None) -> str | None:
    """The weights prefix of an eval's served name (`eval-<12 hex>[-<owner>]`, as a job's manifest
    records it): what a stored job was sampled with."""
    m = re.fullmatch(r"eval-([0-9a-f]{12})(?:-.*)?", name or "")
    return m.group(1) if m else None


def owner_of(job: RunLayout) -> str:
    """6 hex naming an eval job by where it lives (its URL in object storage): the owner of the
    served names its serving() loads."""
    return hashlib.sha256((storage.url_of(job.root) or str(job.root.resolve())).encode()).hexdigest()[:6]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def resolve(spec: str, key: str = "eval.policies") -> Policy:
    """A policy spec -> the weights it names; a missing run round or adapter names the path."""
    check_policy_spec(spec, key)
    if spec == "base":
        return Policy(spec, "base", None, 0)
    head, sep, tail = spec.rpartition(":")
    if sep:
        run, k = storage.local_path(head), int(tail)  # a run dir, or a run in object storage (its mirror)
        if k == 0:
            return Policy(spec, "base", None, 0)
        adapter = RunLayout(run).round(k - 1).train.adapter
        storage.pull(adapter)  # in object storage: the bucket's (a loop's eval resumed on another machine)
        if not has_adapter(adapter):
            raise EvalError(f"{key}: {spec!r} is {policy_name(k)} of {run}, trained by round {k - 1}, but {adapter} "
                            f"holds no adapter (rounds on disk: {RunLayout(run).rounds() or 'none'})")
        sha = weights_digest(adapter) or ""  # in the label: another run's or a retrained round's trials never match
        return Policy(spec, _slug(f"{run.name}-{policy_name(k)}-{sha[:8]}"), adapter, k, sha)
    adapter = Path(spec)
    if not has_adapter(adapter):
        raise EvalError(f"{key}: {spec!r} is neither base nor <run dir>:<k>, and {adapter} holds no adapter "
                        "(no adapter_config.json)")
    named = Policy(spec, "", adapter, None, weights_digest(adapter))  # two dirs of one name differ by weights
    return dataclasses.replace(named, label=_slug(f"adapter-{adapter.resolve().name}-{named.digest[:6]}"))


def eval_name(cfg: RunConfig) -> str:
    """eval.name, else the dataset's last two path parts (datasets/multiturn/heldout -> multiturn-heldout)."""
    if cfg.eval.name:
        return cfg.eval.name
    parts = [p for p in Path(dataset_of(cfg)).resolve().parts[-2:] if p != "datasets"]
    return _slug("-".join(parts))


def dataset_of(cfg: RunConfig) -> str:
    return cfg.eval.dataset or cfg.collect.dataset
