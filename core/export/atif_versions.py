"""An ATIF trajectory for readers of an older format version (``export --atif-version 1.7``).

The run directory's ``trajectory.json`` is always the newest version (``ATIF_VERSION``); Harbor
releases before the one that introduced ATIF-v1.8 reject that version string. This writes a copy at
an older version where the content fits, and says what had to be dropped to fit.

What v1.8 added over v1.7, as far as this export can write it: ``audio`` content parts (a step's
``message`` or an observation result's ``content`` given as a list of parts may hold one, with a
``source.duration_sec``); v1.7 knows ``text`` and ``image`` parts only. Everything else this export
writes (``trajectory_id``, ``subagent_trajectories``, ``llm_call_count``, ``is_copied_context``,
``extra`` on tool calls and observation results) was already in v1.7. Sources: Harbor's RFC 0001
version notes for v1.7 as quoted in the issues of projects that adopted it, and published validators
that pin the v1.6/v1.7/v1.8 contracts (audio is refused below v1.8). The JSON Schemas the tests
validate against are ``tests/schemas/atif-v1.8.schema.json`` and ``atif-v1.7.schema.json``.
"""

from __future__ import annotations

import copy
from typing import Any

from opencode_tui_core.export.atif import ATIF_VERSION

NEWEST = ATIF_VERSION.removeprefix("ATIF-v")
VERSIONS = (NEWEST, "1.7")  # newest first: what ``--atif-version`` accepts

# Content-part types each version accepts in a message or an observation result's content.
_PART_TYPES = {"1.8": frozenset({"text", "image", "audio"}), "1.7": frozenset({"text", "image"})}


def schema_version(version: str) -> str:
    """The ``schema_version`` string of a version: ``ATIF-v1.7``."""
    return f"ATIF-v{version}"


def versioned_file(version: str) -> str:
    """Where ``export --atif-version`` writes an older version in the run directory (the newest stays
    ``trajectory.json``)."""
    return f"trajectory.atif-v{version}.json"


def for_version(doc: dict[str, Any], version: str) -> tuple[dict[str, Any], list[str]]:
    """A copy of the newest document as ``version``, and what was dropped to fit (one line each,
    naming where: ``steps[3].message: an audio part``). The copy's ``extra.atif_downgrade`` says it
    too, so a reader of the file alone can tell."""
    if version not in VERSIONS:
        raise ValueError(f"ATIF version {version!r} is not one this export writes ({', '.join(VERSIONS)})")
    out = copy.deepcopy(doc)
    if version == NEWEST:
        return out, []
    dropped: list[str] = []
    _downgrade(out, version, "", dropped)
    return out, dropped


def _downgrade(traj: dict[str, Any], version: str, where: str, dropped: list[str]) -> None:
    came_from = traj.get("schema_version")
    traj["schema_version"] = schema_version(version)
    allowed = _PART_TYPES[version]
    mine: list[str] = []
    for i, step in enumerate(traj.get("steps") or []):
        step["message"] = _fit(step.get("message"), allowed, f"{where}steps[{i}].message", mine)
        if step["message"] is None:
            step["message"] = ""  # required; every part of it was dropped
        for j, result in enumerate((step.get("observation") or {}).get("results") or []):
            if "content" in result:
                path = f"{where}steps[{i}].observation.results[{j}].content"
                result["content"] = _fit(result["content"], allowed, path, mine)
    dropped.extend(mine)
    if not isinstance(traj.get("extra"), dict):
        traj["extra"] = {}
    traj["extra"]["atif_downgrade"] = {"from": came_from, "dropped": mine}
    for k, child in enumerate(traj.get("subagent_trajectories") or []):
        _downgrade(child, version, f"{where}subagent_trajectories[{k}].", dropped)


def _fit(content: Any, allowed: frozenset[str], path: str, dropped: list[str]) -> Any:
    """Content with the parts the version does not know removed (a string stays as it is)."""
    if not isinstance(content, list):
        return content
    kept = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in allowed:
            kept.append(part)
        else:
            dropped.append(f"{path}: an {kind} part" if kind else f"{path}: a malformed part")
    return kept or None
