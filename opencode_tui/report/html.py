"""The report's HTML building blocks: escaping (redacted first), folding, the page frame.

Every text goes through ``esc``: redacted (``opencode_tui_core.redaction``, as the run directory is) and then escaped.
Long content sits in ``<details>`` elements (expandable without the script); the script only adds
"expand all" / "collapse all". The page fetches nothing: styles and script are inline, and its content
security policy forbids any load.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from opencode_tui_core import __version__
from opencode_tui_core.redaction import redact_text

STYLE = """
:root{--bg:#fafafa;--fg:#1d1f21;--muted:#6b7280;--line:#d9dce1;--err:#b42318;--warn:#a15c00;--ok:#067647;
--acc:#3949ab;--code:#f1f3f5}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,sans-serif;background:var(--bg);color:var(--fg)}
main{max-width:1200px;margin:0 auto;padding:16px 24px 64px}
h1{font-size:20px;margin:8px 0}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:14px 0 6px}section,h2{scroll-margin-top:40px}
nav{position:sticky;top:0;background:var(--bg);border-bottom:1px solid var(--line);padding:6px 0;z-index:1}
nav a{margin-right:12px;color:var(--acc);text-decoration:none}nav button{float:right;margin-left:6px}
table{border-collapse:collapse;margin:4px 0}td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}
th{color:var(--muted);font-weight:600;white-space:nowrap}
pre{background:var(--code);padding:8px;overflow:auto;white-space:pre-wrap;word-break:break-word;margin:4px 0}
pre.term{background:#272822;color:#f8f8f2;white-space:pre;max-height:80vh}
details{border:1px solid var(--line);border-radius:4px;margin:4px 0;padding:2px 8px;background:#fff}
summary{cursor:pointer;padding:2px 0}details[open]>summary{border-bottom:1px solid var(--line);margin-bottom:4px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;color:#fff;background:var(--muted)}
.b-scored{background:var(--ok)}.b-count_as_zero{background:var(--warn)}.b-retry,.b-infra_error{background:var(--err)}
.err{color:var(--err)}.warn{color:var(--warn)}.ok{color:var(--ok)}.muted{color:var(--muted)}
.s-ok{color:var(--ok)}.s-failed{color:var(--err)}.s-running{color:var(--warn)}.s-pending,.s-skipped{color:var(--muted)}
.role{font-weight:700}.r-user{color:var(--acc)}.r-assistant{color:var(--ok)}.r-tool{color:var(--warn)}
.note{background:#fff7e6;border:1px solid #f5d08a;padding:6px 10px;border-radius:4px;margin:8px 0}
.mono{font-family:ui-monospace,monospace}.elided{color:#e6db74;font-style:italic}
"""

SCRIPT = """
function setAll(open){document.querySelectorAll('details').forEach(function(d){d.open=open;});}
document.getElementById('expand-all').addEventListener('click',function(){setAll(true);});
document.getElementById('collapse-all').addEventListener('click',function(){setAll(false);});
"""


def esc(value: Any) -> str:
    """Redacted (like the run directory), then HTML-escaped."""
    return html.escape(redact_text(str(value)))


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… ({len(text) - limit:,} more characters not embedded: see the run directory)"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def facts(rows: Iterable[tuple[str, Any]]) -> str:
    body = "".join(
        f"<tr><th>{esc(k)}</th><td>{v if isinstance(v, Raw) else esc(v)}</td></tr>"
        for k, v in rows
        if v is not None and v != ""
    )
    return f"<table>{body}</table>"


class Raw(str):
    """HTML already escaped (a fact's value shown as is)."""


def details(summary: str, body: str, *, open_: bool = False, cls: str = "") -> str:
    attrs = (" open" if open_ else "") + (f' class="{cls}"' if cls else "")
    return f"<details{attrs}><summary>{summary}</summary>{body}</details>"


def pre(text: str, limit: int, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f"<pre{c}>{esc(clip(text, limit))}</pre>"


def page(title: str, body: str, nav: list[tuple[str, str]] | None = None) -> str:
    links = "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in (nav or []))
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        # no network: nothing may be fetched, whatever the page holds
        "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">"
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body><main>"
        f'<nav>{links}<button id="collapse-all">collapse all</button><button id="expand-all">expand all</button></nav>'
        f"<h1>{esc(title)}</h1>"
        f'<p class="muted">opencode-tui {esc(__version__)} report, made {esc(made)}; secrets redacted as in the run directory.</p>'
        f"{body}</main><script>{SCRIPT}</script></body></html>\n"
    )
