"""Task dirs sent to the nodes of a cluster that share no filesystem with the driver.

The driver packs each task dir of a round once (a tar archive in memory, `pack`) and hands it to
Ray's object store; a node unpacks each archive once into a dir on its own disk (`TaskCache`)
and runs the task's trials from there. So no node needs the driver's checkout or dataset path.
"""
from __future__ import annotations

import hashlib
import io
import tarfile
import tempfile
from pathlib import Path

from wharf.core.errors import WharfError


class ShipError(WharfError, RuntimeError):
    """A task dir could not be packed or unpacked; the message names it."""


def pack(task_dir: Path) -> tuple[str, bytes]:
    """(sha256 of the archive, a tar of `task_dir`'s contents); symlinks stay links."""
    buf = io.BytesIO()
    try:
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(task_dir, arcname=".")
    except OSError as e:
        raise ShipError(f"{task_dir}: cannot pack the task dir for the cluster's nodes ({e})") from None
    data = buf.getvalue()
    return hashlib.sha256(data).hexdigest(), data


class TaskCache:
    """A node's unpacked task dirs, one per archive digest, under a temp dir of the node's own."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or tempfile.mkdtemp(prefix="wharf-tasks-"))
        self._dirs: dict[str, Path] = {}

    def has(self, digest: str) -> bool:
        return digest in self._dirs

    def dir(self, digest: str, name: str, data: bytes | None = None) -> Path:
        """The task's dir on this node, unpacked from `data` the first time its digest is seen."""
        if digest not in self._dirs:
            if data is None or hashlib.sha256(data).hexdigest() != digest:
                raise ShipError(f"task {name}: its archive did not arrive whole (sha256 {digest[:12]}...)")
            dest = self.root / digest[:16] / name
            dest.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(dest, filter="tar")  # no absolute paths, nothing outside dest
            self._dirs[digest] = dest
        return self._dirs[digest]
