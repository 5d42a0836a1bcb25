"""A real ZooKeeper server for tests, from Debian's `zookeeper` package, started with java directly.

Debian installs the server as /usr/share/java/zookeeper.jar (its manifest's Class-Path pulls in
the jute, netty and slf4j jars beside it) and a log4j config in /etc/zookeeper/conf. We write our
own zoo.cfg (free loopback port, temporary data dir, short ticks so sessions expire quickly) and
run `ZooKeeperServerMain` in standalone mode. `stop()` / `start()` keep the data dir, so a
restart keeps every znode and (within the session timeout) every session.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
CONF_DIR = "/etc/zookeeper/conf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ZooKeeperServer:
    """One standalone ZooKeeper on 127.0.0.1:<port> with its data in `data_dir`."""

    def __init__(self, data_dir: str, port: int | None = None) -> None:
        if not os.path.exists(ZOOKEEPER_JAR) or shutil.which("java") is None:
            raise RuntimeError("ZooKeeper is not installed: run `bash scripts/setup.sh zookeeper` "
                               "(make test does it)")
        self.data_dir = data_dir
        self.port = port or free_port()
        self._proc: subprocess.Popen | None = None
        os.makedirs(os.path.join(data_dir, "data"), exist_ok=True)
        self.config = os.path.join(data_dir, "zoo.cfg")
        with open(self.config, "w") as f:
            f.write("\n".join([
                "tickTime=250",
                f"dataDir={os.path.join(data_dir, 'data')}",
                f"clientPort={self.port}",
                "clientPortAddress=127.0.0.1",
                "minSessionTimeout=1000",
                "maxSessionTimeout=30000",
                "admin.enableServer=false",
                "4lw.commands.whitelist=ruok,srvr",
                "",
            ]))

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> None:
        log = open(os.path.join(self.data_dir, "zookeeper.log"), "ab")
        self._proc = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", f"{ZOOKEEPER_JAR}:{CONF_DIR}",
             f"-Dzookeeper.log.dir={self.data_dir}",
             "org.apache.zookeeper.server.ZooKeeperServerMain", self.config],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self._proc.returncode}; "
                                   f"see {self.data_dir}/zookeeper.log")
            if self.is_ok():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ZooKeeper did not answer on {self.hosts} within {timeout}s")

    def is_ok(self) -> bool:
        """True when the server answers ZooKeeper's `ruok` with `imok`."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"ruok")
                return s.recv(4) == b"imok"
        except OSError:
            return False

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def running_zookeeper(data_dir: str):
    """A ZooKeeperServer started in `data_dir` and stopped on exit (the session's, or a
    private one a test may stop and start)."""
    server = ZooKeeperServer(data_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
