"""The one error base. Every error that means "bad input or cannot go on, and the message says
what to do" derives from WharfError; an entry point prints it as one line and exits 1 (a bad
config exits 2, as a usage error). Anything else is a bug and keeps its traceback."""
from __future__ import annotations


class WharfError(Exception):
    """Bad input or a state the run cannot go on from; the message names the file or key and the fix."""
