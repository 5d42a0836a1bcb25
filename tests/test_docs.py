"""Every Python block of README.md and docs/*.md runs as written, unless it says it is a fragment.

A block whose first line is `# fragment` is shown, not run (it needs a cluster of yours, or a
DataFrame it does not build); shell and other blocks are not run here (the CLI page's shell
blocks have a test of their own, with the same fragment marker). The runnable blocks of one
page run in order in one fresh interpreter, like a notebook (a later block may use an earlier
one's names), in an empty working directory, with none of the Spark or Python path settings of
this test run: a page must work for a reader who installed the project and nothing else, which
includes Spark finding a Python with Tally (PYSPARK_PYTHON unset).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRAGMENT = "# fragment"
# A page with Spark blocks starts a JVM and a cluster: minutes on a busy two-core machine.
TIMEOUT_SECONDS = 900

BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)

RUNNER = """
import json, sys
namespace = {"__name__": "__main__"}
for path, line, code in json.load(sys.stdin):
    print(f"--- {path}:{line}", flush=True)
    # Padded so that a traceback names the line of the page, not of the block.
    exec(compile("\\n" * line + code, path, "exec"), namespace)
"""


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line of the block's first code line, 0-based; its code) for every ```python block."""
    return [(text.count("\n", 0, m.start(1)), m.group(1)) for m in BLOCK.finditer(text)]


def is_fragment(code: str) -> bool:
    return code.lstrip("\n").startswith(FRAGMENT)


def runnable(page: Path) -> list[tuple[str, int, str]]:
    text = page.read_text()
    return [(str(page.relative_to(ROOT)), line, code)
            for line, code in python_blocks(text) if not is_fragment(code)]


def clean_env() -> dict[str, str]:
    """This environment without the settings a test run adds and a reader would not have."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYSPARK_", "SPARK_", "_PYSPARK")) and k != "PYTHONPATH"}


def test_blocks_are_found_and_fragments_recognized():
    text = ("intro\n```python\n# fragment\nx = undefined\n```\n"
            "```sh\nmake test\n```\n"
            "```python\nx = 1\n```\n")
    blocks = python_blocks(text)
    assert [is_fragment(code) for _, code in blocks] == [True, False]
    assert blocks[1] == (9, "x = 1\n")
    assert text.splitlines()[9] == "x = 1"


def test_every_page_is_checked():
    assert ROOT / "README.md" in PAGES and ROOT / "docs" / "quickstart.md" in PAGES
    assert runnable(ROOT / "README.md"), "the README's example must run"


@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_page_runs_as_written(page, tmp_path):
    blocks = runnable(page)
    # A session of its own, so that whatever a page starts (a server, a JVM) is stopped with
    # it, even when a block fails before the page's own clean-up. Output goes to files, not
    # pipes: a server the page left running would hold a pipe open after the page ended.
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        process = subprocess.Popen([sys.executable, "-c", RUNNER], stdin=subprocess.PIPE,
                                   stdout=out, stderr=err, text=True, cwd=tmp_path,
                                   env=clean_env(), start_new_session=True)
        try:
            process.stdin.write(json.dumps(blocks))
            process.stdin.close()
            process.wait(timeout=TIMEOUT_SECONDS)
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
    stdout, stderr = out_path.read_text(), err_path.read_text()
    assert process.returncode == 0, (
        f"{page.name}: a block failed (the last '---' line names it)\n"
        f"{stdout[-3000:]}\n{stderr[-6000:]}")
    assert stdout.count("--- ") == len(blocks)
