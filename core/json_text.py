"""Indented JSON for the files people read (run.json, metadata): one place that writes it.

``json.dumps(..., indent=...)`` runs the standard library's pure-Python encoder, whose nested
closures form a reference cycle on every call: garbage only the cyclic collector frees. Written a
dozen times per episode, that garbage (and the memory it held until a full collection) was most of
the controller's growth over a long batch. pydantic-core's encoder writes the same text (two-space
indent, non-ASCII as is, ``Infinity``/``NaN`` as the standard library writes them) and leaves none.
"""

from __future__ import annotations

from typing import Any

import pydantic_core


def indented_json(value: Any, *, sort_keys: bool = False) -> str:
    """``value`` (JSON-like: dicts, lists, strings, numbers, booleans, None) as indented JSON text."""
    if sort_keys:
        value = _sorted(value)
    return pydantic_core.to_json(value, indent=2, inf_nan_mode="constants").decode("utf-8")


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list | tuple):
        return [_sorted(v) for v in value]
    return value
