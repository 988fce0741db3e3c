"""``opencode-tui export RUN_DIR... --format atif|messages [--atif-version 1.8|1.7] [-o PATH]``.

- ``atif`` without ``-o``: (re)writes ``RUN_DIR/trajectory.json`` for each run and prints its path;
  with ``-o PATH``: one run → that file, several → PATH is a directory of ``<run_id>.json``;
  ``-o -``: the document(s) on stdout (one JSON document per line when several).
- ``messages``: one JSON line per run, ``{"run_id", "task_id", "outcome", "messages"}``, on stdout
  or into ``-o PATH``.
- ``--atif-version 1.7``: the same trajectory for readers of the older version (Harbor releases before
  ATIF-v1.8), written beside the newest (``RUN_DIR/trajectory.atif-v1.7.json``) or to ``-o``; what
  had to be dropped to fit is said on stderr and in the copy's ``extra.atif_downgrade``.
Exit 2 when a RUN_DIR is not a run directory or cannot be exported (the others are still written).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from opencode_tui_core.exit_codes import ExitCode


def cmd_export(args: argparse.Namespace) -> int:
    from opencode_tui_core.export.atif import TRAJECTORY_FILE, AtifTrajectory, build_trajectory, to_messages
    from opencode_tui_core.export.atif_versions import NEWEST, for_version, schema_version, versioned_file

    out = args.output
    several = len(args.run_dirs) > 1
    if args.format == "atif" and out not in (None, "-") and several:
        Path(out).mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    status = ExitCode.OK
    for name in args.run_dirs:
        run_dir = Path(name)
        try:
            traj: AtifTrajectory = build_trajectory(run_dir)
        except (OSError, ValueError) as exc:
            print(f"opencode-tui export: {run_dir}: {exc}", file=sys.stderr)
            status = ExitCode.USAGE
            continue
        if args.format == "messages":
            extra = traj.extra or {}
            record = {
                "run_id": extra.get("run_id") or traj.trajectory_id,
                "task_id": extra.get("task_id"),
                "outcome": extra.get("outcome"),
                "messages": to_messages(traj),
            }
            lines.append(json.dumps(record, ensure_ascii=False))
            continue
        text = traj.to_json()
        version = getattr(args, "atif_version", None) or NEWEST
        if version != NEWEST:
            # [atif versions] a copy for older readers; the run directory's trajectory.json stays newest
            doc, dropped = for_version(json.loads(text), version)
            text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
            what = "; ".join(dropped) if dropped else "nothing (the content fits)"
            print(
                f"opencode-tui export: {run_dir}: {schema_version(version)}: dropped {what}", file=sys.stderr
            )
        if out == "-":
            lines.append(json.dumps(json.loads(text), ensure_ascii=False) if several else text.rstrip("\n"))
            continue
        if out is None:
            target = run_dir / (TRAJECTORY_FILE if version == NEWEST else versioned_file(version))
        elif several:
            target = Path(out) / f"{traj.trajectory_id or run_dir.name}.json"
        else:
            target = Path(out)
        target.write_text(text, encoding="utf-8")
        print(target)
    if lines:
        body = "\n".join(lines) + "\n"
        if out in (None, "-"):
            sys.stdout.write(body)
        else:
            Path(out).write_text(body, encoding="utf-8")
            print(out)
    return status
