"""diagnostics.txt's cap: failures and logs, redacted, fitted into ``DIAGNOSTICS_CAP`` characters."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from opencode_tui_core.redaction import redact_text

DIAGNOSTICS_CAP = 16_000


def _header(name: str) -> str:
    return f"===== {name} =====\n"


def _fit(text: str, budget: int) -> str:
    """``text`` cut to exactly ``budget`` characters: head, a truncation marker, tail."""
    if len(text) <= budget:
        return text
    marker = ""
    for _ in range(3):  # the marker's own length depends on the count it reports
        keep = max(budget - len(marker), 0)
        omitted = len(text) - keep
        marker = f"\n[... {omitted} characters truncated ...]\n"
    keep = budget - len(marker)
    if keep <= 0:
        return text[:budget]
    head = keep - keep // 2
    tail = keep // 2
    return text[:head] + marker + (text[len(text) - tail :] if tail else "")


def _water_fill(lengths: list[int], total: int) -> list[int]:
    """Split ``total`` evenly; parts needing less than their share give the rest to the others."""
    budgets = [0] * len(lengths)
    remaining = total
    open_parts = sorted(range(len(lengths)), key=lambda i: lengths[i])
    while open_parts:
        share = remaining // len(open_parts)
        i = open_parts[0]
        if lengths[i] <= share:
            budgets[i] = lengths[i]
            remaining -= lengths[i]
            open_parts.pop(0)
            continue
        extra = remaining - share * len(open_parts)
        for n, j in enumerate(open_parts):
            budgets[j] = share + (1 if n < extra else 0)
        break
    return budgets


def cap_diagnostics(
    parts: Sequence[tuple[str, str]], cap: int = DIAGNOSTICS_CAP, secrets: tuple[str, ...] = ()
) -> str:
    """Combine named diagnostic parts into at most ``cap`` characters, secrets already redacted.

    Every name and text is redacted before anything is measured, so the result is final: write it
    without redacting again (a second pass could grow it, e.g. a truncation marker after ``token=``).

    A ``stderr`` part that repeats another part's text is dropped (it is often the same stream
    captured twice). When the whole does not fit, the budget is split evenly across parts; a part
    smaller than its share keeps all of it and leaves the rest to the others; an oversized part
    keeps its head and tail around a truncation marker. Oversized input yields exactly ``cap``.
    """
    texts = [(redact_text(n, secrets), redact_text(t, secrets)) for n, t in parts if t]
    kept: list[tuple[str, str]] = []
    for name, text in texts:
        if posixpath.basename(name).startswith("stderr"):
            stripped = text.strip()
            if any(stripped and stripped in other for n, other in texts if n != name):
                continue
        kept.append((name, text))
    rendered = "".join(_header(n) + t + ("" if t.endswith("\n") else "\n") for n, t in kept)
    if len(rendered) <= cap:
        return rendered
    overhead = sum(len(_header(n)) + 1 for n, _ in kept)  # header + the final newline of each part
    avail = cap - overhead
    if avail <= 0:
        return rendered[:cap]
    budgets = _water_fill([len(t) for _, t in kept], avail)
    out = "".join(_header(n) + _fit(t, b) + "\n" for (n, t), b in zip(kept, budgets, strict=True))
    return out
