"""The coordinator's per-server view queues: a stuck server delays only itself, a queue keeps
only the newest view of a table, and a server that fails gets the newest view once it answers.

The servers are in-process view holders (the tablet side's LockViews) behind a transport a
test can hold shut, as a paused process holds its socket; every wait is on a condition.
"""

from __future__ import annotations

import threading

from locks import LockView
from locks.tablet_check import LockViews
from locks.view_delivery import ViewDelivery
from tally.errors import UnavailableError
from tests.waiting import wait_until


class Servers:
    """Tablet servers as the coordinator reaches them: each keeps the newest view it got."""

    def __init__(self, names):
        self.views = {name: LockViews() for name in names}
        self.received = {name: [] for name in names}
        self.open = {name: threading.Event() for name in names}
        self.entered = {name: threading.Event() for name in names}
        self.refusing = set()
        for gate in self.open.values():
            gate.set()

    def send(self, server_id, view, timeout):
        self.entered[server_id].set()
        self.open[server_id].wait()  # a paused server: the push hangs until it runs again
        if server_id in self.refusing:
            raise UnavailableError(f"tablet server {server_id} refused the connection")
        self.received[server_id].append(view.version)
        return self.views[server_id].offer(view).version


def view(version, table_id=1):
    return LockView(table_id, [], {}, version)


def test_a_stuck_server_delays_only_itself_and_gets_only_the_newest_view():
    servers = Servers(["stuck", "well"])
    delivery = ViewDelivery(servers.send, pauses=(0.01, 0.05))
    try:
        servers.open["stuck"].clear()
        delivery.publish(view(1), ["stuck", "well"])
        wait_until(servers.entered["stuck"].is_set, "the push to the stuck server begun")
        for version in (2, 3, 4):  # while it hangs: only the newest stays queued
            delivery.publish(view(version), ["stuck", "well"])
        assert delivery.wait(view(4), ["well"], timeout=60) == {}
        assert set(delivery.wait(view(4), ["stuck"], timeout=0)) == {"stuck"}
        servers.open["stuck"].set()
        assert delivery.wait(view(4), ["stuck"], timeout=60) == {}
        assert servers.received["stuck"] == [1, 4]
        assert servers.views["stuck"].get(1).version == 4
    finally:
        delivery.close()


def test_a_refusing_server_gets_the_newest_view_once_it_answers():
    servers = Servers(["away"])
    delivery = ViewDelivery(servers.send, pauses=(0.01, 0.05))
    try:
        servers.refusing.add("away")
        delivery.publish(view(1), ["away"])
        delivery.publish(view(7, table_id=2), ["away"])
        missing = delivery.wait(view(1), ["away"], timeout=0)
        assert set(missing) == {"away"}
        wait_until(lambda: "refused" in (delivery.queue("away").last_error or ""),
                   "the refusal recorded")
        delivery.publish(view(2), ["away"])
        servers.refusing.clear()
        assert delivery.wait(view(2), ["away"], timeout=60) == {}
        assert delivery.wait(view(7, table_id=2), ["away"], timeout=60) == {}
        assert servers.views["away"].get(1).version == 2
        assert 1 not in servers.received["away"]  # superseded while it was away
        assert delivery.queue("away").last_error is None
    finally:
        delivery.close()


def test_a_view_the_server_already_holds_is_not_sent_again():
    servers = Servers(["s"])
    delivery = ViewDelivery(servers.send)
    try:
        delivery.publish(view(5), ["s"])
        assert delivery.wait(view(5), ["s"], timeout=60) == {}
        delivery.publish(view(3), ["s"])  # older than what it confirmed
        delivery.publish(view(5), ["s"])
        delivery.publish(view(6), ["s"])
        assert delivery.wait(view(6), ["s"], timeout=60) == {}
        assert servers.received["s"] == [5, 6]
    finally:
        delivery.close()
