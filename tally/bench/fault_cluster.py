"""A 3-server LocalCluster at replication factor 3 that faults can be done to, and undone.

Tablet server 2 runs in its own network namespace (tally.bench.fault_network), so it can be
partitioned or lose packets; the coordinator, tablet servers 0 and 1 and every client bind the
root end of its veth pair. Every server is a real process with a pid, so each fault is what an
operator would meet:

| fault | how | undone by |
| --- | --- | --- |
| `kill(i)` | SIGKILL | `start(i)` on the same data directory |
| `pause(i)` | SIGSTOP: the process lives, its sockets accept, nothing answers | `resume(i)` (SIGCONT) |
| `fill_disk(i)` | `RLIMIT_FSIZE` of 1 byte on the process: every write that grows a file fails with EFBIG, as on a full disk (Python ignores SIGXFSZ) | `free_disk(i)` |
| `snapshot_copy(i)` / `restore_copy(i)` | the stopped server's data directory copied, and later put back in place of the newer one (a restored backup) | the server starts on it; what it lacks it must fetch |
| `net.partition()`, `net.cut(d)`, `net.loss(p)` | iptables in server 2's namespace | `net.heal()` |
| `restart_coordinator()` | SIGKILL of the coordinator, started again on its port | |

`heal_all()` undoes whatever is still in force and starts what is down: each trial of a shared
cluster ends with it. `close()` stops every process and removes the namespace, even after a
failure; the context manager calls it.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys

from tally.bench.fault_network import IsolatedHost
from tally.server.local_cluster import PROJECT_ROOT, LocalCluster, ServerHandle

ISOLATED = 2     # the tablet server with its own network


class NamespacedHandle(ServerHandle):
    """A ServerHandle whose process runs inside `host`'s namespace, bound to its address."""

    def __init__(self, base: ServerHandle, host: IsolatedHost) -> None:
        args = list(base.args)
        args[args.index("--host") + 1] = host.address
        super().__init__(base.name, base.data_dir, args, base.module, base.env)
        self.host = host

    def start(self, extra: list[str], timeout: float) -> None:
        # As ServerHandle.start, with the command run by `ip netns exec` (which execs it, so
        # the pid is the server's own).
        os.makedirs(self.data_dir, exist_ok=True)
        log = open(os.path.join(self.data_dir, "server.log"), "ab")
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = PROJECT_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        argv = [sys.executable, "-m", self.module, "--data-dir", self.data_dir, *self.args, *extra]
        self.proc = subprocess.Popen(self.host.command(argv), stdout=subprocess.PIPE,
                                     stderr=log, stdin=subprocess.DEVNULL, env=env,
                                     cwd=PROJECT_ROOT)
        log.close()
        self._wait_ready(timeout)


class FaultCluster:
    """See the module docstring. `cluster` is the LocalCluster; `net` server 2's network."""

    def __init__(self, data_dir: str, session_timeout: float | None = None,
                 lock_clock_file: str | None = None, memory_budget: str | None = None) -> None:
        self.net = IsolatedHost()
        try:
            self.cluster = LocalCluster(data_dir, tablet_servers=3, replication_factor=3,
                                        host=self.net.root_address,
                                        session_timeout=session_timeout,
                                        lock_clock_file=lock_clock_file,
                                        memory_budget=memory_budget)
            # Bound to an address of our own veth pair, not loopback: only processes of this
            # machine reach it, and only while the run lasts, so no credentials are needed.
            for handle in [self.cluster.coordinator, *self.cluster.tablet_servers]:
                handle.args.append("--allow-unauthenticated")
            servers = self.cluster.tablet_servers
            servers[ISOLATED] = NamespacedHandle(servers[ISOLATED], self.net)
        except BaseException:
            self.net.close()
            raise
        self.paused: set[int] = set()
        self.full: set[int] = set()

    @property
    def url(self) -> str:
        return self.cluster.url

    @property
    def servers(self) -> list[ServerHandle]:
        return self.cluster.tablet_servers

    def start(self) -> "FaultCluster":
        try:
            self.cluster.start()
        except BaseException:
            self.close()
            raise
        return self

    def index_of(self, server_id: str) -> int:
        for i, handle in enumerate(self.servers):
            if handle.info.get("server_id") == server_id:
                return i
        raise LookupError(f"no tablet server {server_id} in the cluster")

    def server_id(self, i: int) -> str:
        return self.servers[i].info["server_id"]

    # --- process faults -------------------------------------------------------------------

    def kill(self, i: int) -> None:
        self.paused.discard(i)
        self.full.discard(i)
        self.cluster.kill_tablet_server(i)

    def start_server(self, i: int) -> None:
        self.cluster.start_tablet_server(i)

    def stop_server(self, i: int) -> None:
        self.resume(i)
        self.free_disk(i)
        self.cluster.stop_tablet_server(i)

    def pause(self, i: int) -> None:
        os.kill(self.servers[i].proc.pid, signal.SIGSTOP)
        self.paused.add(i)

    def resume(self, i: int) -> None:
        if i in self.paused and self.servers[i].running:
            os.kill(self.servers[i].proc.pid, signal.SIGCONT)
        self.paused.discard(i)

    def fill_disk(self, i: int) -> None:
        hard = resource.prlimit(self.servers[i].proc.pid, resource.RLIMIT_FSIZE)[1]
        resource.prlimit(self.servers[i].proc.pid, resource.RLIMIT_FSIZE, (1, hard))
        self.full.add(i)

    def free_disk(self, i: int) -> None:
        if i in self.full and self.servers[i].running:
            hard = resource.prlimit(self.servers[i].proc.pid, resource.RLIMIT_FSIZE)[1]
            resource.prlimit(self.servers[i].proc.pid, resource.RLIMIT_FSIZE, (hard, hard))
        self.full.discard(i)

    # --- a restored backup ----------------------------------------------------------------

    def _backup_dir(self, i: int) -> str:
        return self.servers[i].data_dir + ".backup"

    def snapshot_copy(self, i: int) -> None:
        """Stop server i, copy its data directory aside, start it again."""
        self.stop_server(i)
        shutil.rmtree(self._backup_dir(i), ignore_errors=True)
        shutil.copytree(self.servers[i].data_dir, self._backup_dir(i), symlinks=True)
        self.start_server(i)

    def restore_copy(self, i: int) -> None:
        """Stop server i and put the copy `snapshot_copy` made in place of its data directory
        (left stopped: the caller starts it when the scenario wants)."""
        self.stop_server(i)
        shutil.rmtree(self.servers[i].data_dir)
        os.replace(self._backup_dir(i), self.servers[i].data_dir)

    # --- the coordinator ------------------------------------------------------------------

    def restart_coordinator(self) -> None:
        self.cluster.kill_coordinator()
        self.cluster.start_coordinator()

    # --- back to health -------------------------------------------------------------------

    def heal_all(self) -> None:
        """Every fault undone and every server running (what each trial owes the next)."""
        self.net.heal()
        for i in range(len(self.servers)):
            self.resume(i)
            self.free_disk(i)
        if not self.cluster.coordinator.running:
            self.cluster.start_coordinator()
        for i, handle in enumerate(self.servers):
            if not handle.running:
                if os.path.isdir(self._backup_dir(i)) and not os.path.isdir(handle.data_dir):
                    os.replace(self._backup_dir(i), handle.data_dir)
                self.cluster.start_tablet_server(i, wait=False)
        self.cluster.wait_for_tablet_servers()

    def close(self) -> None:
        try:
            self.net.heal()
            for i in range(len(self.servers)):
                self.resume(i)
            self.cluster.stop()
        finally:
            self.net.close()

    def __enter__(self) -> "FaultCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
