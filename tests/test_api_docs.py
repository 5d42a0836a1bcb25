"""The API reference (`make api-docs`, scripts/api_docs.py) builds, and shows the public face."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_api_reference_builds_for_the_public_face(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "api_docs.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    face = (tmp_path / "tally.html").read_text()
    for name in ("connect", "Schema", "AggFunction", "TableDescriptor", "TallySink",
                 "LocalCluster"):
        assert f'id="{name}"' in face, name
    client = (tmp_path / "tally" / "client.html").read_text()
    assert 'id="Table.lookup"' in client and 'id="Admin.create_table"' in client
    assert (tmp_path / "sink.html").exists() and (tmp_path / "tally" / "errors.html").exists()
    # Internal packages stay out of the reference.
    assert not (tmp_path / "tally" / "server.html").exists()
    assert not (tmp_path / "tally" / "cli.html").exists()
