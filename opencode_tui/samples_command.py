"""``opencode-tui samples``: the sample tasks that ship in the package (opencode_tui_core.samples), listed or copied."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opencode_tui_core.exit_codes import ExitCode


def cmd_samples(args: argparse.Namespace) -> int:
    from opencode_tui_core.samples import copy_samples, list_samples, samples_root

    if args.samples_command == "copy":
        dest = Path(args.dest)
        if dest.exists() and not dest.is_dir():
            print(f"opencode-tui samples copy: {dest} is not a directory; name a directory", file=sys.stderr)
            return ExitCode.USAGE
        try:
            copied = copy_samples(dest, args.names or None)
        except (ValueError, FileExistsError) as exc:
            print(f"opencode-tui samples copy: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        for path in copied:
            print(path)
        first = copied[0]
        print(
            f"copied {len(copied)} sample(s); run one with `opencode-tui run {first}`",
            file=sys.stderr,
        )
        return ExitCode.OK
    samples = list_samples()
    if not samples:
        print("opencode-tui samples: this installation has no bundled samples", file=sys.stderr)
        return ExitCode.INFRA
    width = max(len(s.name) for s in samples)
    for s in samples:
        print(f"{s.name:<{width}}  {s.summary}")
    print(
        f"from {samples_root()}; `opencode-tui run NAME` runs one (a directory NAME here wins), "
        "`opencode-tui samples copy DIR` copies them to edit",
        file=sys.stderr,
    )
    return ExitCode.OK
