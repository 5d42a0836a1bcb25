"""Every shell block of docs/cli.md runs as written, and every command exits as the page says.

The page's convention: a command line that ends in `# exits N` exits with status N; every other
command exits 0 (each block runs under `set -e`). The first block starts a cluster of its own;
the later ones use the one at `$TALLY_URL`, which a real LocalCluster provides here. A block
whose first line is `# fragment` is shown, not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tally.server import LocalCluster
from tests.test_docs import FRAGMENT

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "cli.md"
SHELL = re.compile(r"^```(?:sh|bash|shell)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
EXPECTED = re.compile(r"^(?P<command>\S.*?)\s+# exits (?P<status>\d+)\s*$")


def shell_blocks(text: str) -> list[tuple[int, str]]:
    """(1-based line of the block's first code line; its code) for every runnable shell block."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in SHELL.finditer(text)
            if not m.group(1).lstrip("\n").startswith(FRAGMENT)]


def checked(first_line: int, code: str) -> tuple[str, int]:
    """The block as bash runs it, each `# exits N` command checked for status N (the others
    fail the block through `set -e`); how many statuses it checks."""
    out, count = ["set -e"], 0
    for number, line in enumerate(code.splitlines(), first_line):
        found = EXPECTED.match(line)
        if found is None:
            out.append(line)
            continue
        count += 1
        want = found["status"]
        out.append(f"{{ {found['command']} ; }} && status=0 || status=$?; "
                   f"[ $status -eq {want} ] || {{ echo \"cli.md line {number}: exited $status, "
                   f"the page says {want}\" >&2; exit 99; }}")
    return "\n".join(out) + "\n", count


def test_the_convention_is_parsed_and_can_fail():
    script, count = checked(10, "true\nfalse  # exits 1\n(exit 3)  # exits 2\n")
    assert count == 2
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert done.returncode == 99 and "cli.md line 12: exited 3, the page says 2" in done.stderr
    done = subprocess.run(["bash", "-c", checked(1, "false\ntrue\n")[0]])
    assert done.returncode == 1  # a command with no stated status must exit 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(str(tmp_path_factory.mktemp("cli-docs")), tablet_servers=1) as c:
        yield c


def test_every_shell_block_of_the_cli_page_exits_as_it_says(cluster, tmp_path):
    blocks = shell_blocks(PAGE.read_text())
    assert len(blocks) >= 2
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLY_")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["TMPDIR"] = str(tmp_path)  # the blocks' mktemp -d
    env["TALLY_URL"] = cluster.url
    statuses = 0
    for line, code in blocks:
        script, count = checked(line, code)
        statuses += count
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=600)
        assert done.returncode == 0, f"cli.md line {line}:\n{done.stdout}\n{done.stderr}"
    stated = len(re.findall(r"# exits \d+", PAGE.read_text()))
    assert statuses == stated, "every `# exits N` of the page is on a line of a run block"
