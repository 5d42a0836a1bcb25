"""The examples in docs/testing.md run as written (so the docs cannot drift from the code).

The page's python blocks are executed in order in one namespace, then every `test_*` function
they define is called (hypothesis-decorated ones run their examples).
"""

from __future__ import annotations

import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "testing.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_docs_testing_examples_run():
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 2, "docs/testing.md lost its examples"
    namespace: dict = {"__name__": "docs_testing_example"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    tests = [v for k, v in namespace.items() if k.startswith("test_") and callable(v)]
    assert tests, "docs/testing.md defines no test function"
    for test in tests:
        test()
