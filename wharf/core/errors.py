"""The one error base. Every error that means "bad input or cannot go on, and the message says
what to do" derives from WharfError; an entry point prints it as one line and exits with its
`exit_code`: 2 when the command line itself is wrong (an argument, a key, a value: UsageError,
and a bad config), 1 when the command could not do it (a file's content, a taken port, a
server). Anything else is a bug and keeps its traceback."""
from __future__ import annotations


class WharfError(Exception):
    """Bad input or a state the run cannot go on from; the message names the file or key and the fix."""

    exit_code = 1


class UsageError(WharfError):
    """An argument or option the command cannot take (swapped, out of range, unknown name): exit 2,
    as argparse's own errors."""

    exit_code = 2
