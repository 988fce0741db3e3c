"""Secret redaction applied to everything the engine writes (run directory, events, logs).

Free text: bearer tokens, ``sk-``-style API keys, ``Authorization:`` header lines, and
``key=value`` pairs whose key names a secret. Structured data (dicts/lists, e.g. parsed JSON):
values under secret-looking keys are replaced whatever they look like, and strings are scrubbed
recursively.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[REDACTED]"

_SECRET_KEY = re.compile(
    r"(?i)^(?:x-)?(?:authorization|proxy-authorization|api[-_]?key|apikey|access[-_]?token|auth[-_]?token|"
    r"refresh[-_]?token|secret|client[-_]?secret|password|passwd|token|x-api-key|cookie|set-cookie)$"
)

_TEXT_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # Authorization header lines, any scheme.
    (re.compile(r"(?im)^(\s*(?:proxy-)?authorization\s*:\s*)(.+)$"), r"\1" + REDACTED),
    # Bearer/Basic tokens anywhere.
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    # Provider-style keys: sk-..., sk-proj-..., nvapi-..., ghp_..., xox?-...
    (
        re.compile(r"\b(?:sk-(?:proj-|ant-)?|nvapi-|ghp_|gho_|github_pat_|xox[abpr]-)[A-Za-z0-9_-]{12,}"),
        REDACTED,
    ),
    # key=value / "key": "value" with a secret-looking key.
    (
        re.compile(
            r"(?i)((?:api[-_]?key|access[-_]?token|auth[-_]?token|secret|password|token)\"?\s*[:=]\s*\"?)"
            r"([^\s\",}]{4,})"
        ),
        r"\1" + REDACTED,
    ),
]


def redact_text(text: str, extra_secrets: tuple[str, ...] = ()) -> str:
    """Scrub secrets out of free text; ``extra_secrets`` are literal values known to be secret."""
    for secret in extra_secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    for pattern, repl in _TEXT_PATTERNS:
        text = pattern.sub(repl, text)
    return text


def redact(value: Any, extra_secrets: tuple[str, ...] = ()) -> Any:
    """Recursively redact a JSON-like value (dicts, lists, strings); other types pass through."""
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if isinstance(k, str) and _SECRET_KEY.match(k) and v not in (None, ""):
                out[k] = REDACTED
            else:
                out[k] = redact(v, extra_secrets)
        return out
    if isinstance(value, list | tuple):
        return [redact(v, extra_secrets) for v in value]
    if isinstance(value, str):
        return redact_text(value, extra_secrets)
    return value


def redact_headers(headers: dict[str, str] | list[tuple[str, str]]) -> dict[str, str]:
    items = headers.items() if isinstance(headers, dict) else headers
    return {k: (REDACTED if _SECRET_KEY.match(k) else redact_text(v)) for k, v in items}
