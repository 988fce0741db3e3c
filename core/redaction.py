"""Secret redaction applied to everything the engine writes (run directory, events, logs).

Free text: bearer tokens, ``sk-``-style API keys, ``Authorization:`` header lines, and
``key=value`` pairs whose key names a secret. Structured data (dicts/lists, e.g. parsed JSON):
values under secret-looking keys are replaced whatever they look like, and strings are scrubbed
recursively.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

REDACTED = "[REDACTED]"

# The names of keys whose values are secrets whatever they look like (case aside).
_SECRET_KEY_NAMES = (
    r"(?:x-)?(?:authorization|proxy-authorization|api[-_]?key|apikey|access[-_]?token|auth[-_]?token|"
    r"refresh[-_]?token|secret|client[-_]?secret|password|passwd|token|x-api-key|cookie|set-cookie)"
)
_SECRET_KEY = re.compile(rf"(?i)^{_SECRET_KEY_NAMES}$")
_BASIC_WORDS = ("basic",)
# The words the key=value pattern's names end in: a match goes on with ``"?\s*[:=]`` right after one.
_NAME_WORDS = ("key", "token", "secret", "password")


def _is_credentials(token: str) -> bool:
    """``user:password`` in base64 (RFC 7617)."""
    try:
        return b":" in base64.b64decode(token, validate=True)
    except (binascii.Error, ValueError):
        return False


def _basic_credentials(match: re.Match[str]) -> str:
    return f"{match.group(1)} {REDACTED}" if _is_credentials(match.group(2)) else match.group(0)


# Each pattern with the words one of which it cannot match without (lower case): a text that holds
# none of a pattern's words is not scanned by it. Most of what the engine writes (events, model
# calls, run.json) holds none, and the scans were most of the cost of writing it.
_TEXT_PATTERNS: list[tuple[tuple[str, ...], re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    # Authorization header lines, any scheme.
    (
        ("authorization",),
        re.compile(r"(?im)^(\s*(?:proxy-)?authorization\s*:\s*)(.+)$"),
        r"\1" + REDACTED,
    ),
    # Bearer tokens anywhere.
    (
        ("bearer",),
        re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"),
        r"\1 " + REDACTED,
    ),
    # Basic credentials anywhere: only what decodes to ``user:password`` (RFC 7617), not a word
    # after "basic" in prose (OpenCode's own tool descriptions say "for basic searches").
    (
        _BASIC_WORDS,
        re.compile(r"(?i)\b(basic)\s+([A-Za-z0-9+/]{4,}={0,2})(?![A-Za-z0-9+/=])"),
        _basic_credentials,
    ),
    # Provider-style keys: sk-..., sk-proj-..., nvapi-..., ghp_..., xox?-...
    (
        ("sk-", "nvapi-", "ghp_", "gho_", "github_pat_", "xox"),
        re.compile(r"\b(?:sk-(?:proj-|ant-)?|nvapi-|ghp_|gho_|github_pat_|xox[abpr]-)[A-Za-z0-9_-]{12,}"),
        REDACTED,
    ),
    # key=value / "key": "value" with a secret-looking key.
    (
        _NAME_WORDS,
        re.compile(
            r"(?i)((?:api[-_]?key|access[-_]?token|auth[-_]?token|secret|password|token)\"?\s*[:=]\s*\"?)"
            r"([^\s\",}]{4,})"
        ),
        r"\1" + REDACTED,
    ),
]
# Non-ASCII letters that ``re``'s IGNORECASE matches to an ASCII one but ``str.lower`` does not map
# to it (dotless i, long s; the dot that lowering leaves after an I with a dot is dropped).
_FOLD = str.maketrans({"\u0131": "i", "\u017f": "s", "\u0307": None})


def _folded(text: str) -> str:
    """``text`` in lower case such that every pattern's match holds one of its words."""
    low = text.lower()
    return low if low.isascii() else low.translate(_FOLD)


# Any pattern's word at all.
_ANY_WORD = re.compile("|".join(re.escape(w) for hints, _, _ in _TEXT_PATTERNS for w in hints))
# What ``could_change`` looks for in a JSON text (folded to lower case), a superset of what can make
# ``redact`` change its value:
# - the words of the other text patterns but Basic's (a match holds one);
# - the key=value pattern's names where a string's text could go on to ``"?\s*[:=]``: in JSON, a
#   quote in a string is ``\"``, and white space is itself, an escape (``\n``) or a ``\uXXXX``; a
#   name followed by anything else (the word ``tokens``, the key ``"pool_key"``) starts no match;
# - a string (a key among them) that is a whole secret key name, quotes included.
_JSON_PREFILTER = re.compile(
    "|".join(
        re.escape(w)
        for hints, _, _ in _TEXT_PATTERNS
        if hints not in (_NAME_WORDS, _BASIC_WORDS)
        for w in hints
    )
    + rf'|(?:{"|".join(_NAME_WORDS)})(?:\\"|\\[nrtfb]|\\u[0-9a-f]{{4}}|\s)*[:=]'
    + rf'|"{_SECRET_KEY_NAMES}(?:\\n)?"'  # (``$`` also matches before a final newline)
)
# Basic's pattern as its strings are written in JSON (white space as itself or escaped), on the text
# as it is (base64 has case): a candidate counts only if it decodes to credentials. (Prose has "basic"
# in it: OpenCode's tool descriptions say "for basic searches".)
_JSON_BASIC = re.compile(
    r"(?i)basic(?:\\[nrtfb]|\\u[0-9a-f]{4}|\s)+([A-Za-z0-9+/]{4,}={0,2})(?![A-Za-z0-9+/=])"
)
# A JSON escape of a character past ASCII (a control character's, as in terminal output, is none).
_NON_ASCII_ESCAPE = re.compile(r"\\u(?!00[0-7])")


def could_change(json_text: str, extra_secrets: tuple[str, ...] = ()) -> bool:
    """False only when ``redact(json.loads(json_text), extra_secrets)`` is sure to change nothing, so
    the walk can be skipped: nothing a pattern or a secret key needs (``_JSON_PREFILTER``) and no
    literal secret (as JSON writes it) is in the text. The run directory's writes and the proxy's
    records take this check first: most of what an episode writes holds none (token counts name
    ``tokens`` but hold no secret), and walking them was most of the cost of writing them."""
    if _NON_ASCII_ESCAPE.search(json_text):
        return True  # a letter written as \uXXXX (json.dumps' default) is not folded: walked
    if _JSON_PREFILTER.search(_folded(json_text)):
        return True
    if any(_is_credentials(m[1]) for m in _JSON_BASIC.finditer(json_text)):
        return True
    for secret in extra_secrets:
        if not secret:
            continue
        if not secret.isascii() or json.dumps(secret)[1:-1] != secret:
            return True  # escaped in JSON (or folded): not looked for, walked
        if secret in json_text:
            return True
    return False


class _Remembered:
    """Redactions of long texts, remembered: a model call's request repeats the system prompt, the
    tool descriptions and every earlier message of the conversation, and the proxy records each call.
    Keyed by a digest of the text and the literal secrets (neither is kept), least recently used
    dropped first, within a bound on the characters held.

    A text is kept only once it is seen a second time: most long texts are never seen again (an
    episode's trajectory, a model's answer), and keeping those filled the budget with texts no lookup
    would hit (a long batch's memory climbed by the budget before it levelled off)."""

    MIN_CHARS = 1024  # shorter texts are scanned again (cheaper than the digest)
    MAX_CHARS = 1 << 20  # longer ones too (one would crowd out the rest)
    BUDGET_CHARS = 4 << 20
    SEEN_MAX = 4096  # digests of texts seen once (20 bytes each)

    def __init__(self) -> None:
        self._done: OrderedDict[bytes, str] = OrderedDict()
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    @staticmethod
    def key(text: str, extra_secrets: tuple[str, ...]) -> bytes:
        h = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=20)
        for secret in extra_secrets:
            h.update(b"\0" + secret.encode("utf-8", "surrogatepass"))
        return h.digest()

    def get(self, key: bytes) -> str | None:
        with self._lock:
            done = self._done.get(key)
            if done is not None:
                self._done.move_to_end(key)
            return done

    def put(self, key: bytes, done: str) -> None:
        with self._lock:
            if key in self._done:
                return
            if self._seen.pop(key, False) is False:  # first sight: only that it was seen
                self._seen[key] = None
                if len(self._seen) > self.SEEN_MAX:
                    self._seen.popitem(last=False)
                return
            self._done[key] = done
            self._chars += len(done)
            while self._chars > self.BUDGET_CHARS:
                _, dropped = self._done.popitem(last=False)
                self._chars -= len(dropped)

    @property
    def held_chars(self) -> int:
        return self._chars


_REMEMBERED = _Remembered()


def redact_text(text: str, extra_secrets: tuple[str, ...] = ()) -> str:
    """Scrub secrets out of free text; ``extra_secrets`` are literal values known to be secret."""
    if not _Remembered.MIN_CHARS <= len(text) <= _Remembered.MAX_CHARS:
        return _redact_text(text, extra_secrets)
    key = _Remembered.key(text, extra_secrets)
    done = _REMEMBERED.get(key)
    if done is None:
        done = _redact_text(text, extra_secrets)
        _REMEMBERED.put(key, done)
    return done


def _redact_text(text: str, extra_secrets: tuple[str, ...]) -> str:
    for secret in extra_secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    low = _folded(text)
    if not _ANY_WORD.search(low):
        return text  # (most strings: one scan instead of one per pattern)
    for hints, pattern, repl in _TEXT_PATTERNS:
        # (A replacement brings in none of the words: the words of the text as it came still decide.)
        if any(h in low for h in hints):
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
