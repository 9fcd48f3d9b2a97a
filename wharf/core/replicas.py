"""Which replicas serve a published policy: publish writes the record, the proxy of a round that
samples the policy routes none of its calls to a replica that refused it, and the loop's health
check names such a replica. A JSON file per policy: runs/<run>/published/<policy>.json."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from wharf.core import atomic, storage
from wharf.core.endpoint import Endpoint
from wharf.core.errors import WharfError


def replica_urls(endpoint_url: str, upstreams: list[str]) -> list[str]:
    """Every upstream the proxy routes to (endpoint.url first, then proxy.upstreams), once each."""
    seen: dict[str, None] = {}
    for u in [endpoint_url, *upstreams]:
        if u:
            seen.setdefault(u.rstrip("/"), None)
    return list(seen)


def same_adapter(root: str | None, adapter_dir: str | Path) -> bool:
    """Whether a replica's `root` for a name (/v1/models) is `adapter_dir`: the same path, or, for
    a run in object storage, the same object under another machine's mirror (<mirror>/<scheme>/
    <bucket>/<key>: a loop resumed elsewhere finds the replicas its first machine loaded)."""
    if not root:
        return False
    here = os.path.realpath(adapter_dir)
    if os.path.realpath(root) == here:
        return True
    url = storage.url_of(here)
    if url is None:
        return False
    scheme, _, rest = url.partition("://")
    return Path(root).as_posix().rstrip("/").endswith(f"/{scheme}/{rest.rstrip('/')}")


def serves_ours(root: str | None, name: str, adapter_dir: str | Path) -> bool:
    """Whether a replica serving `name` from `root` serves this run's adapter: loaded from it, or
    by vLLM's LoRA resolver from `<resolver dir>/<name>` (a copy the user synced; publish never
    loads from a dir so named, so another run's load cannot look like it)."""
    return same_adapter(root, adapter_dir) or (root is not None and Path(root).name == name)


def not_serving(urls: list[str], name: str, adapter_dir: str | Path, api_key: str | None = None) -> dict[str, str]:
    """{url: why} of the replicas that do not serve `name` from `adapter_dir` now, asked one by
    one (/v1/models): what they hold, not what publish recorded (a restart forgets runtime LoRAs)."""
    out = {}
    for url in urls:
        try:
            root = Endpoint(url, api_key).roots().get(name)
        except WharfError as e:
            out[url] = f"unreachable: {e}"
            continue
        if root is None:
            out[url] = f"does not serve {name} now (restarted? runtime LoRAs are lost with a restart)"
        elif not serves_ours(root, name, adapter_dir):
            out[url] = f"serves {name} from {root}, not from {adapter_dir}"
    return out


@dataclass(frozen=True)
class ReplicaResult:
    url: str
    ok: bool
    error: str | None = None
    weights: str | None = None  # sha256 of the adapter weights this replica loaded under the name


@dataclass
class PublishRecord:
    policy: str
    adapter: str
    replicas: list[ReplicaResult] = field(default_factory=list)

    @property
    def refused(self) -> dict[str, str]:
        """{url: why} of the replicas that do not serve the policy."""
        return {r.url: r.error or "refused" for r in self.replicas if not r.ok}

    @property
    def serving(self) -> list[str]:
        return [r.url for r in self.replicas if r.ok]

    def write(self, path: Path) -> None:
        """Written, and in a run in object storage uploaded: a round's collect on another machine reads it."""
        atomic.write_json(path, asdict(self), indent=2)
        storage.push_file(path)

    @classmethod
    def read(cls, path: Path) -> "PublishRecord | None":
        """The record at `path` (the bucket's, in a run in object storage); None when the policy was
        never published from this run."""
        storage.pull_file(path)
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(data["policy"], data["adapter"], [ReplicaResult(**r) for r in data["replicas"]])
