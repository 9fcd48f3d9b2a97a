"""Secrets of a run: random tokens, owner-only files, bearer checks.

Three credentials guard a run: the proxy's admin token (who may open and close rollouts), each
rollout's API key (whose calls a route records) and the endpoint's API key (who may sample or
load adapters). None has a fixed default: unset, each is drawn here per run. Files that hold one
are created owner-only from the start (never chmod-ed after, which leaves a window).
"""
from __future__ import annotations

import hmac
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from wharf.core import atomic

TOKEN_BYTES = 32  # 256 random bits, as a URL-safe string


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def write_private(path: str | Path, data: bytes) -> None:
    """Replace `path` atomically with `data` in a file only its owner can read (mode 0600)."""
    atomic.write_bytes(path, data, mode=0o600)


def bearer(headers: Mapping[str, str], anthropic: bool = False) -> str:
    """The token of `Authorization: Bearer T`; with `anthropic`, else the `x-api-key` header
    (Anthropic clients send the key there). '' when there is none."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key", "").strip() if anthropic else ""


def same(given: str, expected: str) -> bool:
    """Constant-time comparison, so the time taken tells nothing about a secret's prefix."""
    return bool(given) and hmac.compare_digest(given.encode(), expected.encode())


@dataclass(frozen=True)
class AdminAccess:
    """Where a proxy's admin API listens and its token, as the proxy writes them (admin_file)."""

    url: str
    token: str
    pid: int

    def save(self, path: Path) -> None:
        write_private(path, json.dumps({"url": self.url, "token": self.token, "pid": self.pid}).encode())

    @classmethod
    def load(cls, path: Path) -> "AdminAccess":
        try:
            d = json.loads(Path(path).read_text())
            return cls(str(d["url"]), str(d["token"]), int(d["pid"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a readable proxy admin file ({e})") from None

