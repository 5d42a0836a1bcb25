"""The guide's examples run as written (docs must not drift from the code)."""

import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"


def test_guide_python_blocks_run_in_order():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) == 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(GUIDE), "exec"), namespace)
