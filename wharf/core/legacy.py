"""Names from before wharf was one import package. Configs and stored runs written then name
classes as `wharf.collect.agents.minimal:MinimalAgent`; they keep loading (a replay of an old run must
not break), each old name said once in the log."""
from __future__ import annotations

import logging

OLD_ROOTS = ("collect", "convert", "train", "engine", "pipeline")
_said: set[str] = set()


def modern_ref(ref: str) -> str:
    """`wharf.collect.x:Cls` -> `wharf.collect.x:Cls`; any other name (a harbor agent's, a user's own
    module:Class, a new one) as it is."""
    module, colon, _ = ref.partition(":")
    if not colon or module.split(".")[0] not in OLD_ROOTS:
        return ref
    new = f"wharf.{ref}"
    if ref not in _said:
        _said.add(ref)
        logging.getLogger("wharf").info("%s is an old name (before wharf was one package): loading %s", ref, new)
    return new
