"""Whether a server can bind its port, asked before the slow part of its start (loading a model,
recovering a WAL, writing its admin file): a taken port is then one line at once, not an OSError
after the model has loaded."""
from __future__ import annotations

import socket

from wharf.core.errors import WharfError


class PortTaken(WharfError):
    """host:port cannot be bound (in use, or not an address of this machine)."""


def check_bindable(host: str, port: int, key: str) -> None:
    """Bind and release host:port as the server will (SO_REUSEADDR, as aiohttp does); port 0 (any
    free one) always binds. `key`: the config key that sets the port (its host's: `port` -> `host`),
    named in the message."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise PortTaken(f"{key.replace('port', 'host')}={host}: cannot resolve it ({e.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise PortTaken(f"{key}={port}: cannot listen on {host}:{port} ({e.strerror}): stop what listens "
                            f"there, or pick another port with {key}=PORT") from None
