"""`python -m testbed up|down|status`: start, stop or show the test bed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import bed, layout
from .procs import BedError


def _log(msg: str) -> None:
    print(f"testbed: {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="(re)create the bed")
    p_up.add_argument("--hosts", type=int, default=4, help="number of test hosts (default 4)")
    p_up.add_argument("--state-dir", type=Path, help=f"state folder (default {layout.DEFAULT_STATE_DIR})")
    p_up.add_argument(
        "--no-user-ssh",
        action="store_true",
        help="do not add the marked block to ~/.ssh/config and ~/.ssh/known_hosts (plain docker-py ssh:// then fails)",
    )
    p_down = sub.add_parser("down", help="remove the bed (processes, namespaces, links, mounts, state)")
    p_down.add_argument("--state-dir", type=Path)
    p_status = sub.add_parser("status", help="print the state file; exit 1 unless every part answers")
    p_status.add_argument("--state-dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            state = bed.up(args.hosts, args.state_dir, user_ssh=not args.no_user_ssh, log=_log)
            print(state.state_file)
            return 0
        if args.cmd == "down":
            problems = bed.down(args.state_dir, log=_log)
            return 1 if problems else 0
        file = layout.resolve_state_file(args.state_dir)
        if not file.exists():
            _log(f"no bed: {file} does not exist")
            return 1
        sys.stdout.write(file.read_text())
        problems = bed.health(layout.load_state(file))
        for problem in problems:
            _log(f"unhealthy: {problem}")
        return 1 if problems else 0
    except BedError as exc:
        _log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
