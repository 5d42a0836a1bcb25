"""One tablet server's own network, made of parts that exist only while a fault run lasts.

A network namespace holds the server's half of a veth pair (`10.237.K.2/30`); the other half
(`10.237.K.1/30`) stays in the machine's namespace, where the coordinator, the other tablet
servers and the clients bind that address. Every packet to or from the isolated server then
crosses the veth pair, and iptables rules inside the namespace (which no other process of the
machine sees) cut it:

- `partition()`: a silent partition, both ways (DROP, not REJECT: a dead host's network says
  nothing, so the other side waits for its timeouts instead of learning the host is gone);
- `cut("in")` / `cut("out")`: one way only (packets reach the server but its answers are lost,
  or the reverse);
- `loss(p)`: each packet dropped with probability `p`, both ways (this kernel has no
  `sch_netem`, so loss comes from iptables' `statistic` match);
- `heal()`: every rule removed.

Nothing else of the machine is touched: no real interface, no firewall rule outside the
namespace, no sysctl. `close()` (and the context manager) kills what still runs inside the
namespace, deletes it (which deletes the veth pair) and is safe to call twice; `leftovers()`
lists any namespace or veth of this module that still exists, and `sweep()` (run before each
new namespace is made) removes those of runs whose process is gone, such as one killed by
SIGKILL, which no `finally` survives.

Needs root, `ip` (iproute2) and `iptables`; `available()` says why not, for a skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

PREFIX = "tallyf"        # every namespace and veth this module makes starts with it
SUBNET = "10.237"        # the /30s of the pairs: 10.237.K.0/30, K in 1..250


class NetworkFaultError(RuntimeError):
    """A namespace, veth or iptables command failed: the message names the command."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetworkFaultError(f"`{' '.join(argv)}` failed ({done.returncode}): "
                                f"{done.stderr.strip()}")
    return done


def available() -> str | None:
    """None when isolated hosts can be made here, else why not (root, ip, iptables)."""
    if os.geteuid() != 0:
        return "network faults need root (network namespaces and iptables)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"network faults need `{tool}` (Debian package " \
                   f"{'iproute2' if tool == 'ip' else 'iptables'})"
    return None


def leftovers() -> list[str]:
    """Namespaces and veth devices of this module that still exist (none after a clean run)."""
    found = [line.split()[0] for line in _run("ip", "netns", "list").stdout.splitlines()
             if line.startswith(PREFIX)]
    links = _run("ip", "-o", "link", "show").stdout.splitlines()
    found += [line.split(":")[1].strip().split("@")[0] for line in links
              if line.split(":")[1].strip().startswith(PREFIX)]
    return found


def sweep() -> list[str]:
    """Remove the namespaces of runs of this module whose process is gone (a run killed with
    SIGKILL cannot clean up after itself): what ran inside is killed, the namespace and its veth
    pair deleted. A namespace is named after the pid that made it, so a live run's are kept.
    Returns the names removed."""
    removed = []
    for name in leftovers():
        owner = name[len(PREFIX):].partition("p")[2]
        if not owner.isdigit() or os.path.exists(f"/proc/{owner}"):
            continue
        done = _run("ip", "netns", "pids", name, check=False)
        for pid in done.stdout.split():
            try:
                os.kill(int(pid), signal.SIGCONT)
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        _run("ip", "netns", "del", name, check=False)
        removed.append(name)
    return removed


def _used_subnets() -> set[int]:
    used = set()
    for line in _run("ip", "-o", "-4", "addr", "show").stdout.splitlines():
        for word in line.split():
            if word.startswith(SUBNET + "."):
                used.add(int(word.split(".")[2]))
    return used


class IsolatedHost:
    """A namespace and veth pair for one server (see the module docstring)."""

    def __init__(self) -> None:
        reason = available()
        if reason:
            raise NetworkFaultError(reason)
        sweep()
        used = _used_subnets()
        start = os.getpid() % 250
        k = next((1 + (start + i) % 250 for i in range(250) if 1 + (start + i) % 250 not in used),
                 None)
        if k is None:
            raise NetworkFaultError(f"every {SUBNET}.K.0/30 is taken on this machine")
        self.namespace = f"{PREFIX}{k}p{os.getpid()}"
        tag = f"{k}p{os.getpid() % 10000}"   # device names hold at most 15 characters
        self.root_device = f"{PREFIX}{tag}a"
        self.inner_device = f"{PREFIX}{tag}b"
        self.root_address = f"{SUBNET}.{k}.1"
        self.address = f"{SUBNET}.{k}.2"
        self.closed = False
        try:
            _run("ip", "netns", "add", self.namespace)
            _run("ip", "link", "add", self.root_device, "type", "veth", "peer", "name",
                 self.inner_device, "netns", self.namespace)
            _run("ip", "addr", "add", f"{self.root_address}/30", "dev", self.root_device)
            _run("ip", "link", "set", self.root_device, "up")
            self._ip("addr", "add", f"{self.address}/30", "dev", self.inner_device)
            self._ip("link", "set", self.inner_device, "up")
            self._ip("link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def _ip(self, *argv: str) -> None:
        _run("ip", "-n", self.namespace, *argv)

    def _iptables(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", self.namespace, "iptables", "-w", *argv, check=check)

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside the namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    # --- faults ---------------------------------------------------------------------------

    def partition(self) -> None:
        """Drop every packet in and out of the server, silently."""
        self.cut("in")
        self.cut("out")

    def cut(self, direction: str) -> None:
        """Drop the packets arriving at the server ("in") or leaving it ("out")."""
        if direction == "in":
            self._iptables("-A", "INPUT", "-i", self.inner_device, "-j", "DROP")
        elif direction == "out":
            self._iptables("-A", "OUTPUT", "-o", self.inner_device, "-j", "DROP")
        else:
            raise ValueError(f"direction is 'in' or 'out', not {direction!r}")

    def loss(self, probability: float) -> None:
        """Drop each packet in either direction with `probability`."""
        if not 0 < probability < 1:
            raise ValueError(f"a loss probability is between 0 and 1, not {probability}")
        for chain, flag in (("INPUT", "-i"), ("OUTPUT", "-o")):
            self._iptables("-A", chain, flag, self.inner_device, "-m", "statistic", "--mode",
                           "random", "--probability", f"{probability:.4f}", "-j", "DROP")

    def rules(self) -> list[str]:
        """The namespace's iptables rules beyond the empty default policies."""
        if self.closed:
            return []
        listed = self._iptables("-S").stdout.splitlines()
        return [r for r in listed if not r.startswith("-P ")]

    def heal(self) -> None:
        """Remove every rule: the server's network works again."""
        if not self.closed:
            self._iptables("-F", "INPUT", check=False)
            self._iptables("-F", "OUTPUT", check=False)

    # --- cleanup --------------------------------------------------------------------------

    def pids(self) -> list[int]:
        """The processes still running inside the namespace (all of them started by us)."""
        done = _run("ip", "netns", "pids", self.namespace, check=False)
        return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []

    def close(self) -> None:
        """Kill what still runs inside, delete the namespace and the veth pair."""
        if self.closed:
            return
        self.closed = True
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        _run("ip", "netns", "del", self.namespace, check=False)
        _run("ip", "link", "del", self.root_device, check=False)

    def __enter__(self) -> "IsolatedHost":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
