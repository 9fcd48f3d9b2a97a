"""Whether a mirror's files may be trusted to say where they came from (wharf/core/storage.py).

A mirror's stamps say which of its files were exchanged with the bucket; a file with none is this
machine's own write, which push uploads. A mirror filled before stamps existed holds files that
came from the bucket yet carry no stamp: they would pass for this machine's work and be pushed
into a bucket that no longer has them (an emptied prefix, the same URL on a new bucket). Which of
them came from where cannot be told afterwards, so such a mirror is refused as a whole, naming
what to delete. A bucket's mirror dir is known to be of the stamps era once it holds the marker
`<mirror root>/.stamps/mirrors/<scheme>/<bucket>`, written the first time the dir is used while
it is empty, or while the root already keeps stamps (a mirror of this era from before markers).
"""
from __future__ import annotations

import threading
from pathlib import Path

from wharf.core.objects import StorageError

_known: set[Path] = set()  # bucket dirs checked by this process
_lock = threading.Lock()


def _holds_files(directory: Path) -> bool:
    return directory.is_dir() and any(p.is_file() for p in directory.rglob("*"))


def check_origin(root: Path, scheme: str, bucket: str) -> None:
    """Refuse (one line) the mirror of scheme://bucket under `root` when it was filled before stamps."""
    directory = root / scheme / bucket
    if directory in _known:
        return
    with _lock:
        marker = root / ".stamps" / "mirrors" / scheme / bucket
        if not marker.is_file():
            if not (root / ".stamps").is_dir() and _holds_files(directory):
                raise StorageError(
                    f"{directory}: a mirror of {scheme}://{bucket} filled before wharf stamped its files, so which of them "
                    f"came from the bucket is unknown (they would be pushed back as new work): delete {directory} "
                    "(the bucket keeps the run) or set WHARF_MIRROR to an empty directory")
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("stamped\n")
        _known.add(directory)
