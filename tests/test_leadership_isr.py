"""The in-sync rule of a bucket's leader, judged by an injected clock on a real KvTablet.

A follower is in sync while it has caught up with the leader's log end (as of its fetch or of
its previous one) within the lag time; one that keeps fetching without catching up (its disk
full) leaves, one whose offset goes back (a restored copy) leaves at once, and either rejoins
by catching up. An acknowledgement needs min.insync.replicas copies in sync when it is given.
A hypothesis schedule checks the last against every interleaving of writes, fetches, time and
in-sync changes.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from aggfuncs import AggFunction as F
from merge_engine import Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from tally.errors import NotEnoughReplicasError, UnavailableError
from tally.server.tablet.leadership import Leadership
from tally.server.tablet.tablets import HostedTablet, TabletKey
from tally.wire.routing import TableRouting

LAG = 10.0
LEADER, F1, F2 = "leader", "f1", "f2"
REPLICAS = (LEADER, F1, F2)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    schema = (Schema.builder().column("k", pa.int64())
              .agg_column("v", pa.int64(), F.SUM).primary_key("k").build())
    descriptor = TableDescriptor(schema, properties={"table.merge-engine": "aggregation"})
    tablet = KvTablet.open(str(tmp_path_factory.mktemp("leader")), descriptor)
    yield HostedTablet(TabletKey(1, 0, 0), tablet,
                       TableRouting.from_descriptor("default.t", 1, descriptor), None)
    tablet.close()


def write(hosted) -> int:
    """One more record in the leader's log; the log end after it."""
    hosted.tablet.put([{"k": 1, "v": 1}])
    return hosted.tablet.log_end_offset


def lead(hosted, clock, min_isr=2, isr=REPLICAS) -> Leadership:
    hosted.acknowledged = hosted.tablet.log_end_offset
    return Leadership(LEADER, hosted, 1, REPLICAS, isr, min_isr, lag_time=LAG, clock=clock)


def settle(leadership: Leadership) -> frozenset:
    """Apply the leader's proposals as the coordinator would, until it proposes nothing."""
    for _ in range(3):
        wanted = leadership.isr_proposal()
        if wanted is None:
            break
        leadership.update(wanted, leadership.min_isr)
    return leadership.isr


def acknowledged(leadership: Leadership, end: int) -> bool:
    try:
        leadership.wait_replicated(end, timeout=0)
    except UnavailableError:
        return False
    return True


def test_a_follower_that_keeps_up_stays_and_one_stuck_on_an_offset_leaves(hosted):
    clock = Clock()
    leadership = lead(hosted, clock)
    stuck = hosted.tablet.log_end_offset
    for _ in range(30):  # 30 s of writes; f1 keeps up, f2 asks from the same offset each time
        end = write(hosted)
        leadership.follower_fetched(F1, end)
        leadership.follower_fetched(F2, stuck)
        clock.now += 1.0
        if F2 not in settle(leadership):
            break
    assert leadership.isr == {LEADER, F1}
    assert clock.now - 1000.0 > LAG  # not before its lag time ran out
    end = write(hosted)
    leadership.follower_fetched(F1, end)
    assert leadership.wait_replicated(end, timeout=0) >= end  # 2 of 3 copies suffice

    # its disk frees: it catches up and rejoins
    leadership.follower_fetched(F2, end)
    assert settle(leadership) == {LEADER, F1, F2}


def test_a_follower_that_trails_by_one_fetch_is_caught_up(hosted):
    """Asking from the log end the leader had at the previous fetch is catching up: under a
    steady stream of writes a follower is always one fetch behind the newest record."""
    clock = Clock()
    leadership = lead(hosted, clock)
    previous_end = hosted.tablet.log_end_offset
    for _ in range(40):
        end = write(hosted)
        leadership.follower_fetched(F1, previous_end)
        leadership.follower_fetched(F2, previous_end)
        previous_end = end
        clock.now += 1.0
        assert settle(leadership) == set(REPLICAS)


def test_a_silent_follower_leaves_after_the_lag_time_only(hosted):
    clock = Clock()
    leadership = lead(hosted, clock)
    end = hosted.tablet.log_end_offset
    clock.now += LAG
    leadership.follower_fetched(F1, end)
    assert leadership.isr_proposal() is None
    clock.now += 0.5
    assert leadership.isr_proposal() == (LEADER, F1)


def test_a_follower_whose_offset_goes_back_leaves_at_once_and_rejoins_by_catching_up(hosted):
    clock = Clock()
    leadership = lead(hosted, clock)
    before = hosted.tablet.log_end_offset
    end = write(hosted)
    leadership.follower_fetched(F1, end)
    assert not leadership.follower_fetched(F2, end)
    assert leadership.wait_replicated(end, timeout=0) == end
    # f2 comes back with an older copy of itself: it counts with its new offset only
    assert leadership.follower_fetched(F2, before)
    newer = write(hosted)
    leadership.follower_fetched(F1, newer)
    assert not acknowledged(leadership, newer)  # held until f2 is out (not acknowledged on f1's word)
    assert settle(leadership) == {LEADER, F1}
    assert leadership.wait_replicated(newer, timeout=0) == newer
    # f2 fetched before it left: only a fetch after that lets it rejoin, from the log end
    leadership.follower_fetched(F2, end)
    assert settle(leadership) == {LEADER, F1}
    leadership.follower_fetched(F2, newer)
    assert settle(leadership) == set(REPLICAS)


def test_a_write_is_not_acknowledged_when_the_in_sync_set_shrinks_below_min_isr(hosted):
    """Both followers stop fetching: the set shrinks to the leader alone, and the waiting write
    must fail (not acknowledged) rather than pass on the leader's copy alone."""
    clock = Clock()
    leadership = lead(hosted, clock)
    end = write(hosted)
    assert not acknowledged(leadership, end)
    clock.now += LAG + 1
    assert settle(leadership) == {LEADER}
    with pytest.raises(NotEnoughReplicasError, match="not acknowledged"):
        leadership.wait_replicated(end, timeout=0)
    # a read may still wait on the high watermark (nothing is acknowledged by it)
    assert leadership.wait_replicated(end, timeout=0, writing=False) == end


def test_a_lone_follower_rejoins_only_from_the_epochs_start(hosted):
    """A follower out of sync when the epoch began must hold everything up to where the epoch
    began (what the previous leader may have acknowledged) before it joins, even while the new
    leader's high watermark is lower."""
    clock = Clock()
    start = hosted.tablet.log_end_offset
    hosted.acknowledged = start - 1 if start else 0
    leadership = Leadership(LEADER, hosted, 1, REPLICAS, (LEADER, F1), 2, lag_time=LAG,
                            clock=clock)
    clock.now += 0.1
    leadership.follower_fetched(F2, hosted.acknowledged)
    assert F2 not in settle(leadership)
    leadership.follower_fetched(F2, start)
    assert F2 in settle(leadership)


# --- any schedule ----------------------------------------------------------------------------

steps = st.lists(st.one_of(
    st.tuples(st.just("write")),
    st.tuples(st.just("fetch"), st.sampled_from((F1, F2)),
              st.sampled_from(("end", "previous", "same", "back"))),
    st.tuples(st.just("tick"), st.floats(0.1, 2 * LAG)),
    st.tuples(st.just("isr")),
    st.tuples(st.just("ack")),
), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=steps, min_isr=st.sampled_from((1, 2, 3)))
def test_every_acknowledgement_is_on_min_isr_copies_that_hold_it(hosted, schedule, min_isr):
    """Model: the offsets each follower last reported. A write acknowledged at any moment has
    min.insync.replicas copies in sync, and every in-sync follower's last offset covers it."""
    clock = Clock()
    leadership = lead(hosted, clock, min_isr=min_isr)
    reported = {F1: None, F2: None}
    pending = []
    for step in schedule:
        kind = step[0]
        if kind == "write":
            pending.append(write(hosted))
        elif kind == "fetch":
            _, follower, how = step
            end = hosted.tablet.log_end_offset
            last = reported[follower] if reported[follower] is not None else end
            offset = {"end": end, "previous": min(last + 1, end), "same": last,
                      "back": max(0, last - 1)}[how]
            leadership.follower_fetched(follower, offset)
            reported[follower] = offset
        elif kind == "tick":
            clock.now += step[1]
        elif kind == "isr":
            settle(leadership)
        for end in list(pending):
            try:
                leadership.wait_replicated(end, timeout=0)
            except (UnavailableError, NotEnoughReplicasError):
                continue
            pending.remove(end)
            assert len(leadership.isr) >= min_isr
            for follower in leadership.isr - {LEADER}:
                assert reported[follower] is not None and reported[follower] >= end, \
                    (follower, reported, end, leadership.isr)
