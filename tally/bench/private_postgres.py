"""A throwaway PostgreSQL 15 server for the Spark benchmarks (Debian's package, installed when
missing): initdb'd in a temporary directory owned by `postgres` (root may not run it), on a free
loopback port, fsync off; stopped and removed on exit."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile

PG_BIN = "/usr/lib/postgresql/15/bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """A throwaway PostgreSQL server: installed from Debian when missing, initdb'd in a temp dir
    owned by `postgres` (root may not run it), on a free loopback port; stopped and removed."""

    def __init__(self):
        if not os.path.exists(os.path.join(PG_BIN, "pg_ctl")):
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(["apt-get", "install", "-y", "-qq", "postgresql"], check=True,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        self.dir = tempfile.mkdtemp(prefix="tally-bench-pg-")
        self.port = free_port()
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        if self.as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")

    def __enter__(self) -> "PrivatePostgres":
        data = os.path.join(self.dir, "data")
        run = lambda *a: subprocess.run([*self.as_postgres, *a], check=True,  # noqa: E731
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run(f"{PG_BIN}/initdb", "-D", data, "-A", "trust", "-U", "postgres")
        run(f"{PG_BIN}/pg_ctl", "-D", data, "-w", "-l", os.path.join(self.dir, "log"),
            "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                  "-c fsync=off -c synchronous_commit=off", "start")
        self.data = data
        return self

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def __exit__(self, *exc) -> None:
        subprocess.run([*self.as_postgres, f"{PG_BIN}/pg_ctl", "-D", self.data, "-m", "immediate",
                        "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)
