"""A stand-in for `pip` in the k3deploy test bed's image: `show`, `list`, `freeze`, `--version`.

Pure standard library (importlib.metadata), reading the distributions on sys.path the way
pip does: `pip show NAME...` prints pip's fields, `---` between packages, warns
`WARNING: Package(s) not found: X` on stderr for missing names and exits 1 only when none
was found (pip 23/24 behaviour). Anything else that would change the environment is refused.
In the image this file is the `pip` package (`pip`, `pip3` and `python3 -m pip` all work).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

PIP_VERSION = "24.0"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, metadata.Distribution]:
    """Canonical name -> distribution; the first one on sys.path wins, as for imports."""
    found: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), dist)
    return found


def requires(dist: metadata.Distribution) -> list[str]:
    """Names of unconditional requirements (those behind an `extra ==` marker are left out)."""
    names = []
    for req in dist.requires or []:
        spec, _, marker = req.partition(";")
        if "extra" in marker:
            continue
        match = _NAME.match(spec)
        if match:
            names.append(match.group(1))
    return names


def location(dist: metadata.Distribution) -> str:
    return str(Path(str(dist.locate_file(""))))


def show(names: list[str], files: bool, verbose: bool) -> int:
    if not names:
        print("WARNING: ERROR: Please provide a package name or names.", file=sys.stderr)
        return 1
    dists = installed()
    missing = sorted(n for n in names if canonical(n) not in dists)
    if missing:
        print(f"WARNING: Package(s) not found: {', '.join(missing)}", file=sys.stderr)
    printed = 0
    for query in names:
        dist = dists.get(canonical(query))
        if dist is None:
            continue
        meta = dist.metadata
        required_by = sorted(
            (other.metadata["Name"] or "UNKNOWN" for other in dists.values()
             if canonical(meta["Name"]) in {canonical(r) for r in requires(other)}),
            key=str.lower,
        )  # fmt: skip
        if printed:
            print("---")
        printed += 1
        print(f"Name: {meta['Name']}")
        print(f"Version: {dist.version}")
        for field, key in (("Summary", "Summary"), ("Home-page", "Home-page"), ("Author", "Author"),
                           ("Author-email", "Author-email"), ("License", "License")):  # fmt: skip
            print(f"{field}: {meta.get(key) or ''}")
        print(f"Location: {location(dist)}")
        print(f"Requires: {', '.join(sorted(requires(dist), key=str.lower))}")
        print(f"Required-by: {', '.join(required_by)}")
        if verbose:
            print(f"Metadata-Version: {meta.get('Metadata-Version') or ''}")
            print(f"Installer: {(dist.read_text('INSTALLER') or '').strip()}")
            print("Classifiers:")
            for classifier in meta.get_all("Classifier") or []:
                print(f"  {classifier}")
            print("Entry-points:")
            for line in (dist.read_text("entry_points.txt") or "").splitlines():
                print(f"  {line.strip()}")
            print("Project-URLs:")
            for url in meta.get_all("Project-URL") or []:
                print(f"  {url}")
        if files:
            print("Files:")
            if dist.files is None:
                print("Cannot locate RECORD or installed-files.txt")
            for path in sorted(str(f) for f in dist.files or []):
                print(f"  {path}")
    return 0 if printed else 1


def listing(freeze: bool) -> int:
    rows = sorted(((d.metadata["Name"], d.version) for d in installed().values()), key=lambda r: r[0].lower())
    if freeze:
        for name, version in rows:
            print(f"{name}=={version}")
        return 0
    width = max([len("Package"), *(len(n) for n, _ in rows)])
    vwidth = max([len("Version"), *(len(v) for _, v in rows)])
    print(f"{'Package'.ljust(width)} {'Version'.ljust(vwidth)}".rstrip())
    print(f"{'-' * width} {'-' * vwidth}")
    for name, version in rows:
        print(f"{name.ljust(width)} {version}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    quiet_flags = {"--disable-pip-version-check", "--no-color", "--isolated", "--no-input", "-q", "--quiet"}
    args = [a for a in args if a not in quiet_flags]
    if not args or args[0] in ("-h", "--help", "help"):
        print("\nUsage:\n  pip <command> [options]\n\nCommands:\n  show    Show information about installed "
              "packages.\n  list    List installed packages.\n  freeze  Output installed packages in "
              "requirements format.\n")  # fmt: skip
        return 0
    if args[0] in ("-V", "--version"):
        here = Path(__file__).resolve().parent
        print(f"pip {PIP_VERSION} from {here} (python {sys.version_info[0]}.{sys.version_info[1]})")
        return 0
    command, rest = args[0], args[1:]
    if command == "show":
        names = [a for a in rest if not a.startswith("-")]
        return show(names, files=bool({"-f", "--files"} & set(rest)), verbose=bool({"-v", "--verbose"} & set(rest)))
    if command in ("list", "freeze"):
        return listing(freeze=command == "freeze")
    print(f'ERROR: unknown command "{command}" (the k3deploy test-bed image only has show, list, freeze)',
          file=sys.stderr)  # fmt: skip
    return 1


if __name__ == "__main__":
    sys.exit(main())
