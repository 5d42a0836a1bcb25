"""Writes the API reference of Tally's public face as HTML with pdoc: `make api-docs`.

    python scripts/api_docs.py [OUTPUT_DIR]        # default: docs/api

The public face is what a user imports: `tally` (its names, `tally.errors`, `tally.testing`),
the client a connection hands out (`tally.client`: Connection, Admin, Table, writers) and the
Spark sinks (`sink`: TallySink, register, SinkOptions, EpochFailedError). Their internal
modules are left out (what they contain that is public, their package re-exports).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# pdoc module specs: a package brings its submodules; "!regex" drops the names it matches.
INTERNAL = ["cli", "server", "wire", "meta", "demo", "bench", "sizes", "timestamps"]
MODULES = [
    "tally", *(rf"!tally\.{name}($|\.)" for name in INTERNAL),
    "tally.client", r"!tally\.client\.",
    "sink", r"!sink\.",
    "merge_engine.testing",
]


def write(output: Path) -> Path:
    """Render the reference into `output`; returns the page of `tally`."""
    import pdoc

    pdoc.render.configure(docformat="markdown", footer_text="Tally API reference")
    pdoc.pdoc(*MODULES, output_directory=output)
    return output / "tally.html"


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "api"
    print(f"API reference: {write(out)}")
