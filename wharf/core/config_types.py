"""The value types of the config's fields: ranges written on the type, so a field says its limits
where it is declared (`port: Port`), and the loader (wharf/core/configio.py) names the key that broke one."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

Port = Annotated[int, Field(ge=0, le=65535)]  # 0: any free port
Positive = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0)]
Probability = Annotated[float, Field(gt=0, le=1)]
NonNegative = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Device = Literal["auto", "cpu", "cuda"]
# The group-relative advantage estimators (wharf/convert/advantages.py implements each).
Advantage = Literal["grpo", "dr_grpo", "rloo", "zero"]


def _secret(value: str) -> str:
    # An empty token would let requests with no credentials through.
    if not value.strip():
        raise ValueError("empty: leave it unset (null) for a random one per run, or give a non-empty secret")
    return value


Secret = Annotated[str, AfterValidator(_secret)]
