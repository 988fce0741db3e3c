"""OpenCode's transcript, read after confirmed cleanup only: snapshot the SQLite database with the
backup API, export the root session's messages and parts (and those of the subagent sessions it
started, linked by ``parent_id``), and count what happened in the root session.

Schema facts (OpenCode 1.18.x, see docs/opencode-notes.md): tables ``session(id, parent_id, title…)``,
``message(id, session_id, time_created, data JSON)``, ``part(id, message_id, session_id, time_created,
data JSON)``. Assistant message data carries ``tokens {input, output, reasoning, cache {read, write}}``,
``agent`` (``build``, ``compaction``, ``title``…) and ``finish``. A compaction is a user-message part
``{"type": "compaction", "auto": bool, "overflow": bool}``; a tool call is a part of type ``tool``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from opencode_tui_core.events import TranscriptStats


def snapshot(source_dir: Path, dest: Path) -> Path:
    """Consolidate ``opencode.db`` (+ its -wal) from ``source_dir`` into a single file ``dest``."""
    src = source_dir / "opencode.db"
    if not src.exists():
        raise FileNotFoundError(f"OpenCode's database was not found in the sandbox copy ({src})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        dest.unlink()
    with sqlite3.connect(src) as conn, sqlite3.connect(dest) as out:
        conn.backup(out)
    return dest


def compaction_trigger(part: dict[str, Any]) -> str:
    """What started a compaction, from its part: ``overflow``, ``auto``, ``manual`` or ``unknown``."""
    if part.get("overflow"):
        return "overflow"
    if part.get("auto"):
        return "auto"
    return "manual" if "auto" in part else "unknown"


def _messages(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """A session's messages in order, each with its parts."""
    parts_by_message: dict[str, list[dict[str, Any]]] = {}
    for part_id, msg_id, data in conn.execute(
        "SELECT id, message_id, data FROM part WHERE session_id = ? ORDER BY time_created, id", (session_id,)
    ):
        part = json.loads(data)
        part.setdefault("id", part_id)
        parts_by_message.setdefault(msg_id, []).append(part)
    messages = []
    for msg_id, data in conn.execute(
        "SELECT id, data FROM message WHERE session_id = ? ORDER BY time_created, id", (session_id,)
    ):
        info = json.loads(data)
        info.setdefault("id", msg_id)
        messages.append({"info": info, "parts": parts_by_message.get(msg_id, [])})
    return messages


def _subagents(conn: sqlite3.Connection, root: str) -> list[dict[str, Any]]:
    """Every session started under ``root`` (subagents of the ``task`` tool, and theirs), oldest first."""
    rows = conn.execute(
        "WITH RECURSIVE tree(id) AS (SELECT id FROM session WHERE parent_id = ? "
        "UNION SELECT s.id FROM session s JOIN tree t ON s.parent_id = t.id) "
        "SELECT s.id, s.title, s.parent_id FROM session s JOIN tree USING (id) ORDER BY s.rowid",
        (root,),
    ).fetchall()
    return [
        {"session": {"id": sid, "title": title, "parent_id": parent}, "messages": _messages(conn, sid)}
        for sid, title, parent in rows
    ]


def export(db: Path) -> tuple[dict[str, Any], TranscriptStats]:
    """The root session's messages with their parts (and, under ``subagents``, those of every session it
    started), and the counts derived from the root session's."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        sessions = conn.execute(
            "SELECT s.id, s.title, (SELECT count(*) FROM message m WHERE m.session_id = s.id) AS n "
            "FROM session s WHERE s.parent_id IS NULL ORDER BY n DESC, s.id"
        ).fetchall()
        if not sessions:
            raise ValueError("OpenCode's database holds no root session: the agent never started a session")
        session_id, title, _ = sessions[0]
        messages = _messages(conn, session_id)
        subagents = _subagents(conn, session_id)
    finally:
        conn.close()

    tools: dict[str, int] = {}
    triggers: list[str] = []
    tin = tout = tcache = treason = 0
    seen_tokens = False
    for m in messages:
        info = m["info"]
        for part in m["parts"]:
            if part.get("type") == "tool":
                tools[part.get("tool", "unknown")] = tools.get(part.get("tool", "unknown"), 0) + 1
            elif part.get("type") == "compaction":
                triggers.append(compaction_trigger(part))
        tokens = info.get("tokens") if info.get("role") == "assistant" else None
        cache = (tokens.get("cache") or {}) if isinstance(tokens, dict) else {}
        # OpenCode creates each assistant message with every count at 0 and fills them in when the
        # step finishes: all zeros is a message cut off before it reported (unknown), not zero tokens.
        reported = isinstance(tokens, dict) and any(
            int(v or 0)
            for v in (tokens.get("input"), tokens.get("output"), tokens.get("reasoning"), *cache.values())
        )
        if reported:
            assert isinstance(tokens, dict)
            seen_tokens = True
            tin += int(tokens.get("input") or 0) + int(cache.get("read") or 0) + int(cache.get("write") or 0)
            tout += int(tokens.get("output") or 0) + int(tokens.get("reasoning") or 0)
            tcache += int(cache.get("read") or 0)
            treason += int(tokens.get("reasoning") or 0)
    stats = TranscriptStats(
        messages=len(messages),
        tool_calls=tools,
        compactions=len(triggers),
        compaction_triggers=triggers,
        # Unknown stays null: only messages that reported tokens count.
        tokens_in=tin if seen_tokens else None,
        tokens_out=tout if seen_tokens else None,
        tokens_cache_read=tcache if seen_tokens else None,
        tokens_reasoning=treason if seen_tokens else None,
        subagent_sessions=len(subagents),
    )
    doc = {"session": {"id": session_id, "title": title}, "messages": messages, "subagents": subagents}
    return doc, stats
