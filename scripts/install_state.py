"""What scripts/setup.sh has to install into a venv, from what it installed there before.

    python scripts/install_state.py plan EXTRAS      # prints current, project, or extras
                                                     # and a requirement a line
    python scripts/install_state.py record EXTRAS    # after an install of EXTRAS succeeded

Run with the venv's Python. The venv keeps a stamp (tally-setup.json) of the project's inputs
as installed (pyproject.toml, setup.py, the Cython sources, the Python) and of the extras
installed with them. The plan is `current` when nothing changed and the extras asked for are
in, `extras` with the requirements to add when only extras are missing (no build), and
`project` when the project must be installed again (pip then recompiles only the native
modules whose sources changed)."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import sysconfig
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = "tally-setup.json"
# Directories that hold no package source: the venv, builds, VCS and tool state.
SKIPPED = {"build", "docs", "tests", "jvm", "node_modules"}


def project_config(root: Path) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())


def native_sources(root: Path) -> list[Path]:
    """The Cython sources (.pyx, .pxd) in the tree, in a stable order."""
    found = []
    for path in sorted(root.iterdir()):
        if path.is_dir() and not path.name.startswith(".") and path.name not in SKIPPED:
            found += [p for p in path.rglob("*") if p.suffix in (".pyx", ".pxd")]
    return sorted(found)


def project_digest(root: Path) -> str:
    """A digest of everything an install of the project is made from, besides the extras."""
    digest = hashlib.sha256()
    for path in [root / "pyproject.toml", root / "setup.py", *native_sources(root)]:
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest() if path.exists() else b"-")
    digest.update(f"{sys.version}\0{sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    return digest.hexdigest()


def requested(extras: str) -> list[str]:
    return [name.strip() for name in extras.split(",") if name.strip()]


def self_reference(requirement: str, project: str) -> list[str] | None:
    """The extras `requirement` names if it is the project itself (`name[a,b]`), else None."""
    match = re.fullmatch(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?\s*", requirement)
    if match is None or normalized(match.group(1)) != normalized(project):
        return None
    return requested(match.group(2) or "")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(config: dict, extras: list[str]) -> set[str]:
    """The extras asked for and those they name through the project itself
    (`tally-aggregates[spark]` in [test])."""
    optional = config["project"].get("optional-dependencies", {})
    name = config["project"]["name"]
    seen: set[str] = set()
    pending = list(extras)
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"install_state: no extra named {extra!r} in pyproject.toml "
                             f"(extras: {', '.join(sorted(optional))})")
        seen.add(extra)
        for requirement in optional[extra]:
            pending += self_reference(requirement, name) or []
    return seen


def requirements(config: dict, extras: set[str]) -> list[str]:
    """The third-party requirements of `extras` (the project's own references left out)."""
    optional = config["project"].get("optional-dependencies", {})
    name = config["project"]["name"]
    return sorted({req for extra in extras for req in optional[extra]
                   if self_reference(req, name) is None})


def read_stamp(venv: Path) -> dict:
    try:
        stamp = json.loads((venv / STAMP).read_text())
        return stamp if isinstance(stamp, dict) else {}
    except (OSError, ValueError):
        return {}


def compiled_modules_present(root: Path) -> bool:
    """Whether every Cython module has its compiled file in the tree (a `git clean` removes
    them while the venv stays)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    return all(pyx.with_name(pyx.stem + suffix).is_file()
               for pyx in native_sources(root) if pyx.suffix == ".pyx")


def plan(root: Path, venv: Path, extras: str) -> tuple[str, list[str]]:
    config = project_config(root)
    wanted = closure(config, requested(extras))
    stamp = read_stamp(venv)
    if stamp.get("project") != project_digest(root) or not compiled_modules_present(root):
        return "project", []
    missing = wanted - set(stamp.get("extras", []))
    if not missing:
        return "current", []
    return "extras", requirements(config, missing)


def record(root: Path, venv: Path, extras: str) -> None:
    config = project_config(root)
    digest = project_digest(root)
    stamp = read_stamp(venv)
    # Extras installed against other inputs may lack what those inputs now require.
    kept = set(stamp.get("extras", [])) if stamp.get("project") == digest else set()
    stamp = {"project": digest, "extras": sorted(kept | closure(config, requested(extras)))}
    partial = venv / (STAMP + ".partial")
    partial.write_text(json.dumps(stamp, indent=1) + "\n")
    partial.replace(venv / STAMP)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("plan", "record"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    venv = Path(sys.prefix)
    if argv[0] == "record":
        record(ROOT, venv, argv[1])
        return 0
    action, reqs = plan(ROOT, venv, argv[1])
    print("\n".join([action, *reqs]))  # one a line: a requirement may hold spaces or `<`
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
