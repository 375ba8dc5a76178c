"""Decode modes by name: each mode's policy (`policies.py`; the anchor experiment's in `anchor.py`)."""

from __future__ import annotations

from yue.decode.anchor import AnchorPolicy, AnchorVerifiedPolicy
from yue.decode.policies import ARPolicy, HybridPolicy, NARPolicy, VerifiedPolicy

POLICIES = {
    p.name: p for p in (ARPolicy, VerifiedPolicy, HybridPolicy, NARPolicy, AnchorPolicy, AnchorVerifiedPolicy)
}


def get_policy(mode: str):
    """The policy object for a mode name."""
    if mode not in POLICIES:
        raise ValueError(f"mode must be one of {', '.join(POLICIES)}; got {mode!r}")
    return POLICIES[mode]()
