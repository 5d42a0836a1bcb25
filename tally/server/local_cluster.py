"""LocalCluster: a real cluster of server processes on loopback ports, for tests, demo, benchmarks.

    with tally.LocalCluster(data_dir, tablet_servers=2, zookeeper=None) as cluster:
        conn = tally.connect(cluster.url)

starts one coordinator process and `tablet_servers` tablet-server processes
(`python -m tally.server`), each with its own directory under `data_dir` (`coordinator/`,
`tablet-0/`, ...), and waits until the coordinator sees every tablet server live. Started again on an existing `data_dir`, it
restarts that cluster: the same server identities (kept in each tablet directory) and data, on
new ports. `kill_tablet_server(i)` (SIGKILL), `start_tablet_server(i)`, `restart_coordinator()`
and friends drive failure tests.

`LocalCluster(..., metrics=True)` gives every server a Prometheus endpoint on a free loopback
port, its URL in `handle.metrics` (`cluster.coordinator.metrics`, `cluster.tablet_servers[i]
.metrics`); `metrics_per_bucket=True` adds the partition and bucket labels.

`LocalCluster(..., authenticate=True)` writes an auth file into `data_dir` (kept for restarts):
a cluster credential for its servers and one client token per role, in `cluster.tokens`
(`tally.connect(cluster.url, token=cluster.tokens["write"])`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

from tally.errors import ClusterError, TallyError
from tally.server.access import CLIENT_ROLES
from tally.server.credentials import Credentials, new_secret, write_auth_file
from tally.server.process import READY
from tally.wire.channel import FlightChannel

# the checkout this module is in: its servers run this code, not another installed copy
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ServerHandle:
    """One server process: its command line, log file, address once ready."""

    def __init__(self, name: str, data_dir: str, args: list[str],
                 module: str = "tally.server", env: dict | None = None) -> None:
        self.name = name
        self.data_dir = data_dir
        self.args = args
        self.module = module  # tally.server, or tally.cli for a tiering process
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.address: str | None = None
        self.info: dict = {}

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def metrics(self) -> str | None:
        """The URL of the server's Prometheus metrics, when the cluster serves them."""
        return self.info.get("metrics")

    @property
    def port(self) -> int | None:
        return int(self.address.rsplit(":", 1)[1]) if self.address else None

    def start(self, extra: list[str], timeout: float) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        log = open(os.path.join(self.data_dir, "server.log"), "ab")
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = PROJECT_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        where = ["--data-dir", self.data_dir] if self.module == "tally.server" else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *where, *self.args, *extra],
            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env,
            cwd=PROJECT_ROOT)
        log.close()
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        buffer = b""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ClusterError(f"{self.name} exited with {self.proc.returncode} before it "
                                   f"was ready: {self._last_log_line()}; see "
                                   f"{self.data_dir}/server.log")
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                buffer += chunk
                for line in buffer.decode(errors="replace").splitlines():
                    if line.startswith(READY):
                        self.info = json.loads(line[len(READY):])
                        self.address = self.info["address"]
                        return
        self.kill()
        raise ClusterError(f"{self.name} was not ready within {timeout}s; "
                           f"see {self.data_dir}/server.log")

    def _last_log_line(self) -> str:
        """A server that fails to start ends its log with the one line saying why."""
        try:
            with open(os.path.join(self.data_dir, "server.log"), "rb") as f:
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        return lines[-1] if lines else "no log line"

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (the crash tests' failure)."""
        if self.running:
            self.proc.kill()
        self._reap()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM and wait for a clean shutdown (SIGKILL if it hangs)."""
        if self.running:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.wait()
            if self.proc.stdout:
                self.proc.stdout.close()
        self.proc = None


class LocalCluster:
    """A coordinator and N tablet servers as local processes (see the module docstring)."""

    def __init__(self, data_dir: str, tablet_servers: int = 2, zookeeper: str | None = None,
                 authenticate: bool = False, host: str = "127.0.0.1",
                 max_batch_bytes: int | None = None, startup_timeout: float = 60.0,
                 memory_budget: str | None = None, lock_clock_file: str | None = None,
                 tls=None, metrics: bool = False, metrics_per_bucket: bool = False,
                 replication_factor: int | None = None,
                 replica_replace_after: float | None = None,
                 session_timeout: float | None = None, remote_dir: str | None = None,
                 snapshot_interval: float | None = None,
                 segment_interval: float | None = None, datalake_dir: str | None = None,
                 tiering: bool | int = False, tier_timeout: float | None = None) -> None:
        """`lock_clock_file`: every server judges lock expiry by the wall clock plus the
        seconds in this file, so tests expire locks without sleeping (server.clock).
        `tls`: a tally.wire.tls.TlsFiles every server uses (its certificate, key, CA and
        whether it verifies clients): the cluster then serves grpc+tls:// only.
        `metrics`: every server serves Prometheus metrics on a free loopback port
        (`handle.metrics`); `metrics_per_bucket` labels them by bucket too.
        `replication_factor`: the cluster's default copies per bucket (None: 3 with three
        tablet servers or more, else 1); `replica_replace_after`: seconds before a gone
        server's copies are made again elsewhere (None: the server's default, 60);
        `session_timeout`: seconds of missed heartbeats before a tablet server counts as gone
        (embedded metadata only; None: the server's default). `remote_dir`: every tablet
        server uploads snapshots and changelog segments there, every `snapshot_interval` and
        `segment_interval` seconds (None: the server's defaults). `datalake_dir`: the root of
        the lake tables; `tiering`: start a tiering process (or that many) once the cluster
        is up (`cluster.tier_processes`); `tier_timeout`: seconds a tiering process may miss
        heartbeats before its tables move (None: the server's default, 15)."""
        self.data_dir = os.path.abspath(data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        saved = self._load_settings()
        self.zookeeper = zookeeper if zookeeper is not None else saved.get("zookeeper")
        self.tls = tls
        self.tokens: dict[str, str] = {}
        self.cluster_token: str | None = None
        self.host = host
        self.startup_timeout = startup_timeout
        existing = saved.get("tablet_servers", 0)
        count = max(tablet_servers, existing)
        common = ["--host", host, "--log-level", "INFO"]
        if self.zookeeper:
            common += ["--zookeeper", self.zookeeper]
        auth_file = os.path.join(self.data_dir, "auth.toml")
        if authenticate or os.path.exists(auth_file):
            self._credentials(auth_file)
            common += ["--auth-file", auth_file]
        if metrics or metrics_per_bucket:
            common += ["--metrics-port", "0"]  # on loopback, whatever `host` is
        if metrics_per_bucket:
            common += ["--metrics-per-bucket"]
        if lock_clock_file:
            common += ["--lock-clock-file", os.path.abspath(lock_clock_file)]
        if tls is not None:
            common += ["--tls-cert", os.path.abspath(tls.cert), "--tls-key", os.path.abspath(tls.key)]
            if tls.ca:
                common += ["--tls-ca", os.path.abspath(tls.ca)]
            if tls.verify_clients:
                common += ["--tls-verify-clients"]
        tablet_args = common + (["--max-batch-bytes", str(max_batch_bytes)]
                                if max_batch_bytes else [])
        if memory_budget is not None:
            tablet_args += ["--memory-budget", str(memory_budget)]
        if remote_dir is not None:
            tablet_args += ["--remote-dir", remote_dir if "://" in remote_dir
                            else os.path.abspath(remote_dir)]
        for flag, seconds in (("--snapshot-interval", snapshot_interval),
                              ("--segment-interval", segment_interval)):
            if seconds is not None:
                tablet_args += [flag, str(seconds)]
        if replication_factor is None:
            replication_factor = saved.get("replication_factor") or (3 if count >= 3 else 1)
        self.replication_factor = replication_factor
        coordinator_args = common + ["--role", "coordinator", "--default-replication-factor",
                                     str(replication_factor)]
        if replica_replace_after is not None:
            coordinator_args += ["--replica-replace-after", str(replica_replace_after)]
        if session_timeout is not None:
            coordinator_args += ["--session-timeout", str(session_timeout)]
        if datalake_dir is not None:
            coordinator_args += ["--datalake-dir", datalake_dir if "://" in datalake_dir
                                 else os.path.abspath(datalake_dir)]
        if tier_timeout is not None:
            coordinator_args += ["--tier-timeout", str(tier_timeout)]
        tier_env = {"TALLY_TOKEN": self.tokens["admin"]} if self.tokens else {}
        tier_args = ["tier", "--verbose"]
        if tls is not None and tls.ca:
            tier_args += ["--tls-ca", os.path.abspath(tls.ca)]
        self.tier_processes = [
            ServerHandle(f"tiering process {i}", os.path.join(self.data_dir, f"tier-{i}"),
                         tier_args + ["--tier-id", f"local-tier-{i}"], module="tally.cli",
                         env=tier_env)
            for i in range(int(tiering))]
        self.coordinator = ServerHandle("coordinator", os.path.join(self.data_dir, "coordinator"),
                                        coordinator_args)
        self.tablet_servers = [
            ServerHandle(f"tablet server {i}", os.path.join(self.data_dir, f"tablet-{i}"),
                         tablet_args + ["--role", "tablet"]) for i in range(count)]
        self._save_settings(count)

    def _credentials(self, path: str) -> None:
        """The cluster's auth file: made on the first authenticated start, then kept."""
        if not os.path.exists(path):
            write_auth_file(path, new_secret(),
                            {f"local-{role}": (new_secret(), role) for role in CLIENT_ROLES})
        loaded = Credentials.load(path)
        self.cluster_token = loaded.cluster
        self.tokens = {role: token for token, role in loaded.clients.values()}

    # --- settings kept in the data dir, so a restart finds the same cluster -----------------

    def _settings_path(self) -> str:
        return os.path.join(self.data_dir, "cluster.json")

    def _load_settings(self) -> dict:
        try:
            with open(self._settings_path()) as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def _save_settings(self, count: int) -> None:
        with open(self._settings_path(), "w") as f:
            json.dump({"tablet_servers": count, "zookeeper": self.zookeeper,
                       "replication_factor": self.replication_factor}, f)

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The coordinator's URL: what `tally.connect` takes."""
        if not self.coordinator.address:
            raise ClusterError("the cluster is not running")
        return self.coordinator.address

    def start(self) -> "LocalCluster":
        if self.tier_processes:
            # they run in this Python: say why at once, not as a process that died at start
            from tally.server.coordinator.lake_readiness import require_deltalake

            require_deltalake("LocalCluster(tiering=...) starts `tally tier` processes, which")
        try:
            self.start_coordinator()
            for i in range(len(self.tablet_servers)):
                self.start_tablet_server(i, wait=False)
            self.wait_for_tablet_servers()
            for i in range(len(self.tier_processes)):
                self.start_tier_process(i)
        except BaseException:
            self.stop()
            raise
        return self

    def start_coordinator(self) -> None:
        port = self.coordinator.port  # a restarted coordinator keeps its port
        self.coordinator.start(["--port", str(port)] if port else [], self.startup_timeout)

    def stop_coordinator(self) -> None:
        self.coordinator.stop()

    def kill_coordinator(self) -> None:
        self.coordinator.kill()

    def restart_coordinator(self, kill: bool = False) -> None:
        self.kill_coordinator() if kill else self.stop_coordinator()
        self.start_coordinator()
        self.wait_for_tablet_servers()

    def start_tablet_server(self, i: int, wait: bool = True) -> None:
        extra = [] if self.zookeeper else ["--coordinator", self.url]
        self.tablet_servers[i].start(extra, self.startup_timeout)
        if wait:
            self.wait_for_tablet_servers()

    def start_tier_process(self, i: int = 0) -> None:
        self.tier_processes[i].start(["--url", self.url], self.startup_timeout)

    def kill_tier_process(self, i: int = 0) -> None:
        self.tier_processes[i].kill()

    def kill_tablet_server(self, i: int) -> None:
        self.tablet_servers[i].kill()

    def stop_tablet_server(self, i: int) -> None:
        self.tablet_servers[i].stop()

    def restart_tablet_server(self, i: int, kill: bool = True) -> None:
        self.kill_tablet_server(i) if kill else self.stop_tablet_server(i)
        self.start_tablet_server(i)

    def wait_for_tablet_servers(self, timeout: float | None = None) -> None:
        """Until the coordinator lists every running tablet server as live at its address."""
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        wanted = {h.info["server_id"]: h.address for h in self.tablet_servers if h.running}
        channel = FlightChannel(self.url, self.cluster_token, timeout=5, tls=self.tls)
        try:
            while True:
                try:
                    servers = channel.action("list_servers")
                    live = {s["server_id"]: s["address"] for s in servers if s["live"]}
                    if all(live.get(sid) == addr for sid, addr in wanted.items()):
                        return
                except TallyError:
                    pass
                if time.monotonic() > deadline:
                    raise ClusterError(f"tablet servers {sorted(wanted)} did not join the "
                                       f"coordinator within the timeout")
                time.sleep(0.05)
        finally:
            channel.close()

    def stop(self) -> None:
        for handle in self.tier_processes:
            handle.stop()
        for handle in self.tablet_servers:
            handle.stop()
        self.coordinator.stop()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
