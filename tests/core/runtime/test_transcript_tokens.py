"""Agent tokens from OpenCode's transcript: a message cut off before it reported is unknown, not 0.

The database is a real SQLite file with the tables the export reads (session, message, part), holding
the shapes OpenCode 1.18.32 writes: an assistant message starts with every count at 0 and gets its
counts when its step finishes.
"""

from __future__ import annotations

import json
import sqlite3

from opencode_tui_core.runtime.transcript import export


def _db(tmp_path, *assistant_tokens):
    db = tmp_path / "opencode.db"
    conn = sqlite3.connect(db)
    conn.executescript(
        "CREATE TABLE session (id TEXT, title TEXT, parent_id TEXT);"
        "CREATE TABLE message (id TEXT, session_id TEXT, time_created INT, data TEXT);"
        "CREATE TABLE part (id TEXT, message_id TEXT, session_id TEXT, time_created INT, data TEXT);"
    )
    conn.execute("INSERT INTO session VALUES ('s1', 't', NULL)")
    conn.execute("INSERT INTO message VALUES ('m0', 's1', 0, ?)", (json.dumps({"role": "user"}),))
    for i, tokens in enumerate(assistant_tokens, 1):
        conn.execute(
            "INSERT INTO message VALUES (?, 's1', ?, ?)",
            (f"m{i}", i, json.dumps({"role": "assistant", "tokens": tokens})),
        )
    conn.commit()
    conn.close()
    return db


ZERO = {"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}}


def test_a_message_cut_off_before_reporting_is_unknown(tmp_path):
    _, stats = export(_db(tmp_path, ZERO))
    assert (stats.tokens_in, stats.tokens_out) == (None, None)


def test_reported_messages_are_summed_and_the_cut_one_adds_nothing(tmp_path):
    done = {"input": 1500, "output": 33, "reasoning": 0, "cache": {"read": 100, "write": 0}}
    _, stats = export(_db(tmp_path, done, ZERO))
    assert (stats.tokens_in, stats.tokens_out, stats.tokens_cache_read) == (1600, 33, 100)
