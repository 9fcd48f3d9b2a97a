"""A reward the tests could have planted is not taken: the verifier sandbox's reward proof.

The code under test runs with the grader's rights, so it can write /logs/verifier/reward.json
and then kill the grader before the grader overwrites it. So, in the verifier phase, the
sandbox puts a fresh random key in KEY_FILE (in /tests, which is never downloaded). A grader
that knows the protocol (wharf/tasks/tools/pytest_grade.py) reads and deletes it before any test
runs, and writes beside reward.json a MAC_FILE: HMAC-SHA256(key, reward.json's bytes), hex.
When /logs/verifier is downloaded:
  * KEY_FILE still holds the key: the grader does not use the protocol (a SWE-Gym test.sh, a
    custom one); the reward is taken as before;
  * otherwise (consumed, deleted, replaced): reward.json must come with a MAC that verifies, or
    it is replaced by {"reward": 0.0, "reward_rejected": 1} (reward.txt removed) and
    reward_rejected.txt says why. A 0, not a verifier error: the key is consumed before the
    tests run, so a missing proof means the grading died or was overwritten while the agent's
    code ran, which SWE-bench would score 0 too;
  * unless the grader said it could not judge: JUDGE_ERROR (one line, why: the tests never
    started) with a MAC that verifies. Then no reward file is kept at all, so harbor records a
    verifier error (left out of training, unscored in eval), not a 0 the policy did not earn.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import shutil
from pathlib import Path

from wharf.tasks.tools.judge_io import ERROR_FILE as JUDGE_ERROR  # the judge's "could not judge" file

KEY_FILE = "/tests/.wharf-reward-key"
MAC_FILE = "reward.json.mac"
REJECTED = "reward_rejected.txt"


def new_key() -> bytes:
    return secrets.token_hex(32).encode()


def mac(key: bytes, reward_json: bytes) -> str:
    return hmac.new(key, reward_json, hashlib.sha256).hexdigest()


def why_not(verifier_dir: Path, key: bytes) -> str | None:
    """None when the downloaded verifier dir's reward.json carries a valid MAC, else why not."""
    reward, proof = verifier_dir / "reward.json", verifier_dir / MAC_FILE
    if not reward.is_file():
        return "the grader consumed the reward key but wrote no reward.json"
    if not proof.is_file():
        return f"reward.json has no {MAC_FILE}: it was not written by the grader (or the grader was killed)"
    if not hmac.compare_digest(proof.read_text(errors="replace").strip(), mac(key, reward.read_bytes())):
        return f"{MAC_FILE} does not verify: reward.json was not written by the grader"
    return None


def judge_error(verifier_dir: Path, key: bytes) -> str | None:
    """The grader's own word that it could not judge (JUDGE_ERROR, its MAC verified), or None."""
    error, proof = verifier_dir / JUDGE_ERROR, verifier_dir / (JUDGE_ERROR + ".mac")
    if not (error.is_file() and proof.is_file()) or error.is_symlink() or proof.is_symlink():
        return None
    line = error.read_bytes()
    if not hmac.compare_digest(proof.read_text(errors="replace").strip(), mac(key, line)):
        return None
    return line.decode("utf-8", "replace").strip()[:2000]


def _clear(verifier_dir: Path) -> None:
    for name in ("reward.json", "reward.txt", REJECTED):
        path = verifier_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def enforce(verifier_dir: Path, key: bytes, key_left: bytes | None) -> str | None:
    """Apply the rule above to a downloaded verifier dir; returns why a reward was rejected."""
    if key_left is not None and hmac.compare_digest(key_left.strip(), key):
        return None  # the grader does not take part
    why = why_not(verifier_dir, key)
    if why is not None and judge_error(verifier_dir, key) is not None:
        _clear(verifier_dir)  # whatever was planted: no reward at all, harbor's verifier error
        return None
    if why is not None:
        _clear(verifier_dir)
        (verifier_dir / "reward.json").write_text(json.dumps({"reward": 0.0, "reward_rejected": 1}) + "\n")
        (verifier_dir / REJECTED).write_text(why + "\n")
    return why
