"""What every grader of wharf/tasks/tools shares: the process it grades from and the verdict it writes.

Standalone (stdlib only, plain `python -I -S` works): the graders run inside sandboxes.
  * harden(): this process stops being dumpable (no same-uid process reads its memory) and
    becomes the subreaper of what it starts (jail.py's fallback, where namespaces cannot be had);
  * take_reward_key(): the sandbox's reward key (wharf/collect/sandbox/rewardproof.py), read and
    deleted before any code under test runs;
  * write_verdict(): grading.json, then reward.json (flat numbers: harbor's rule) and the MAC
    of the very bytes it serialised (never re-read from disk), last, over anything the code
    under test left there;
  * write_error(): no reward at all, where the judge could not judge (the tests never started):
    ERROR_FILE says why, MACed like reward.json, so the sandbox records a verifier error, not a 0.
"""
from __future__ import annotations

import ctypes
import hashlib
import hmac
import json
import os
import shutil

PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
ERROR_FILE = "verifier_error.txt"  # wharf/collect/sandbox/rewardproof.py's JUDGE_ERROR


def harden() -> None:
    """Linux only."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def take_reward_key(path: str | None) -> bytes | None:
    """The sandbox's reward key, gone from disk before any code under test runs."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            key = f.read().strip()
        os.remove(path)
    except OSError:
        return None
    return key or None


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def encode(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def write_bytes(path: str, data: bytes) -> None:
    """`data` at `path` through a fresh temp file (never a link or a file someone else opened),
    renamed into place: a reader never sees half a file."""
    tmp = path + ".tmp"
    remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_json(path: str, obj: dict) -> None:
    write_bytes(path, encode(obj))


def write_verdict(out: str, numbers: dict, detail: dict, reward_key: bytes | None) -> None:
    """grading.json, reward.json and, with the sandbox's key, reward.json.mac = HMAC-SHA256(key,
    reward.json's bytes): what wharf/collect/sandbox/rewardproof.py checks when it downloads `out`.
    reward.json is serialised once, here in memory, and those bytes are written and MACed:
    nothing is read back from `out`, which the code under test could write."""
    os.makedirs(out, exist_ok=True)
    reward_path = os.path.join(out, "reward.json")
    mac_path = reward_path + ".mac"
    for path in (os.path.join(out, "grading.json"), reward_path, mac_path):
        remove(path)  # the code under test may have left a dir or a link there
    reward = encode(numbers)
    try:
        story = encode(detail)
    except (ValueError, TypeError, RecursionError) as e:  # the verdict stands without its story
        story = encode({"reward": numbers.get("reward"), "error": f"grading.json could not be encoded: {e}"})
    write_bytes(os.path.join(out, "grading.json"), story)
    write_bytes(reward_path, reward)
    if reward_key is not None:
        write_bytes(mac_path, (hmac.new(reward_key, reward, hashlib.sha256).hexdigest() + "\n").encode())


def write_error(out: str, why: str, detail: dict, reward_key: bytes | None) -> None:
    """No verdict: grading.json (`detail`), ERROR_FILE (`why`, one line) and, with the sandbox's
    key, its MAC; every reward file removed. Only the grader holds the key, so the code under
    test cannot turn its own 0 into a dropped trial this way."""
    os.makedirs(out, exist_ok=True)
    error_path = os.path.join(out, ERROR_FILE)
    for name in ("grading.json", "reward.json", "reward.json.mac", "reward.txt", ERROR_FILE, ERROR_FILE + ".mac"):
        remove(os.path.join(out, name))
    line = (" ".join(why.split()) + "\n").encode()
    write_bytes(os.path.join(out, "grading.json"), encode(detail))
    write_bytes(error_path, line)
    if reward_key is not None:
        write_bytes(error_path + ".mac", (hmac.new(reward_key, line, hashlib.sha256).hexdigest() + "\n").encode())
