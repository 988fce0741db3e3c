"""``opencode-tui ctl RUN_ID|RUN_DIR ACTION``: act on a live run through its control socket (issue 27).

A run id is looked up in ``--runs-dir`` (default ./runs). A run that is not live, unknown or not
ours is one line on stderr and exit 2; a refused act (``say`` when not held, an answer naming a tool
the held request does not offer) is one line and exit 1, nothing changed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opencode_tui_core.exit_codes import ExitCode

ACTIONS = ("status", "pause", "continue", "step", "say", "answer", "edit", "abort", "break")


def add_parser(sub: argparse._SubParsersAction) -> None:
    ct = sub.add_parser(
        "ctl",
        help="debug a live run: status, pause, continue, step, say TEXT, answer TEXT|--file F, "
        "edit [TEXT|--file F], abort, break COND",
    )
    ct.add_argument(
        "run", metavar="RUN_ID|RUN_DIR", help="the live run (its directory, or its id in --runs-dir)"
    )
    ct.add_argument("action", choices=ACTIONS, metavar="ACTION", help=", ".join(ACTIONS))
    ct.add_argument(
        "text",
        nargs="?",
        help="say: the message; answer: the reply text; edit: the edited reply (none: forward the held "
        "call and hold the model's reply for editing); break: the condition",
    )
    ct.add_argument(
        "--file",
        metavar="F",
        help='answer/edit: a JSON file {"text": "...", "tool_calls": [{"name": "bash", "arguments": {...}}]}',
    )
    ct.add_argument("--json", action="store_true", help="status: print the reply as JSON")
    ct.add_argument("--runs-dir", default="runs", help="where run ids are looked up (default ./runs)")


def _fail(message: str, code: int = ExitCode.USAGE) -> int:
    print(f"opencode-tui ctl: {message}", file=sys.stderr)
    return code


def _run_dir(ref: str, runs_dir: str) -> Path | None:
    path = Path(ref)
    if path.is_dir():
        return path
    candidate = Path(runs_dir) / ref
    return candidate if candidate.is_dir() else None


def cmd_ctl(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from opencode_tui_core.debugger.client import NotLive, request
    from opencode_tui_core.debugger.protocol import CtlRequest
    from opencode_tui_core.model import HandAnswer

    run_dir = _run_dir(args.run, args.runs_dir)
    if run_dir is None:
        return _fail(f"no run {args.run!r} (not a directory, nor a run id in {args.runs_dir}/)")
    req = CtlRequest(command=args.action)
    if args.action in ("say", "break"):
        if not args.text:
            return _fail(f"{args.action} needs its text: opencode-tui ctl RUN {args.action} TEXT")
        req.text = args.text
    elif args.action in ("answer", "edit"):
        if args.text is not None and args.file is not None:
            return _fail(f"{args.action}: give the reply text or --file F, not both")
        if args.action == "answer" and args.text is None and args.file is None:
            return _fail("answer needs the reply text, or --file F with a JSON answer (one of them)")
        if args.file is not None:
            try:
                req.answer = HandAnswer.model_validate_json(Path(args.file).read_text())
            except OSError as exc:
                return _fail(f"cannot read {args.file}: {exc.strerror or exc}")
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "answer"
                return _fail(f"{args.file}: {where}: {first['msg']} (expected {{'text', 'tool_calls'}})")
        elif args.text is not None:
            req.answer = HandAnswer(text=args.text)
    elif args.text is not None:
        return _fail(f"{args.action} takes no text")
    try:
        reply = request(run_dir, req)
    except NotLive as exc:
        return _fail(str(exc))
    if args.json:
        print(reply.model_dump_json(indent=2))
    else:
        print(reply.message)
        if reply.status is not None and reply.status.held is not None:
            held = reply.status.held
            print(held.conversation)
            if held.reply is not None:
                print("the model's reply, held for editing:")
                print(held.reply.model_dump_json(exclude_defaults=True, indent=2))
    return ExitCode.OK if reply.ok else 1


__all__ = ["add_parser", "cmd_ctl"]
