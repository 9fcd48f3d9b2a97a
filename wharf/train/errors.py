"""train's own error (its module of its own so that every train module can raise it)."""
from __future__ import annotations

from wharf.core.errors import WharfError


class TrainError(WharfError, RuntimeError):
    """Training cannot start or go on; the message says what to do."""
