"""Paths of the shared fixtures (``shared/`` sits beside the checkout, in CI too)."""

from __future__ import annotations

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
_CANDIDATES = (CHECKOUT.parent / "shared", Path("/work/shared"))
SHARED = next((path for path in _CANDIDATES if path.is_dir()), _CANDIDATES[0])
REAL_COMMITLOG = SHARED / "fixtures" / "real-commitlog" / "00000000000000000000"
