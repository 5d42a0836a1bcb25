"""The leader lease of a tablet server and the grants the coordinator keeps, on a moved clock.

A tablet server leads its replicated buckets only until `lease_seconds` after the send time of
its last answered heartbeat whose replica version its applied roles cover; the coordinator
deposes a server only `session_timeout` after the last grant it recorded (from the heartbeat's
arrival), never while an election's answer could still renew it. A hypothesis model checks the
lease against a plain statement of when it holds.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from tally.errors import NotLeaderError
from tally.server.coordinator.lease_grants import LeaseGrants
from tally.server.tablet.leader_lease import PENDING_ANSWERS, LeaderLease, covers


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def lease(clock: Clock) -> LeaderLease:
    return LeaderLease("ts-1", clock=clock)


def answer(version: str, seconds: float = 2.0) -> dict:
    return {"replica_version": version, "lease_seconds": seconds}


def test_no_lease_before_an_answer():
    clock = Clock()
    held = lease(clock)
    assert not held.valid()
    with pytest.raises(NotLeaderError, match="ts-1.*no heartbeat answered"):
        held.check("key", 1, "bucket 0 of 'default.t'")


def test_the_lease_runs_from_the_send_time_and_expires():
    clock = Clock()
    held = lease(clock)
    held.applied("c1:3")
    sent = clock.now
    clock.now += 1.5  # the answer took long: the lease still counts from the send
    held.answered(sent, answer("c1:3"))
    assert held.valid()
    held.check("key", 1, "b")
    clock.now = sent + 1.999
    assert held.valid()
    clock.now = sent + 2.0
    assert not held.valid()
    with pytest.raises(NotLeaderError, match="ran out .* ago"):
        held.check("key", 1, "b")


def test_an_answer_renews_and_an_older_one_never_shortens():
    clock = Clock()
    held = lease(clock)
    held.applied("c1:3")
    held.answered(100.0, answer("c1:3"))
    held.answered(101.0, answer("c1:3"))
    held.answered(100.5, answer("c1:3"))  # a late answer to an earlier heartbeat
    clock.now = 102.9
    assert held.valid()
    clock.now = 103.0
    assert not held.valid()


def test_a_newer_version_does_not_renew_until_its_roles_are_applied():
    clock = Clock()
    held = lease(clock)
    held.applied("c1:3")
    held.answered(100.0, answer("c1:3"))
    held.answered(101.0, answer("c1:4"))  # something changed: our roles may be stale
    clock.now = 101.5
    assert held.valid()  # the lease it had still runs to its end
    clock.now = 102.5
    assert not held.valid()
    with pytest.raises(NotLeaderError, match="replica version c1:4 are on their way"):
        held.check("key", 1, "b")
    held.applied("c1:4")  # the refresh landed: the answer it waited for renews
    assert held.valid()
    clock.now = 103.0
    assert not held.valid()


def test_roles_newer_than_the_answer_renew_at_once():
    clock = Clock()
    held = lease(clock)
    held.applied("c1:7")
    held.answered(100.0, answer("c1:5"))
    assert held.valid()


def test_a_restarted_coordinator_counts_anew():
    assert covers("a:9", "a:3")
    assert not covers("a:3", "a:9")
    assert not covers("a:9", "b:0")  # another coordinator instance: roles must be asked again
    assert not covers(None, "a:0")
    assert not covers("a:1", None)
    clock = Clock()
    held = lease(clock)
    held.applied("a:9")
    held.answered(100.0, answer("b:0"))
    assert not held.valid()
    held.applied("b:1")
    assert held.valid()


def test_an_answer_granting_no_lease_renews_nothing():
    clock = Clock()
    held = lease(clock)
    held.applied("c1:1")
    held.answered(100.0, answer("c1:1", seconds=0))
    assert not held.valid()
    held.answered(100.0, {"replica_version": "c1:1", "lease_seconds": True})
    assert not held.valid()


def test_a_resigned_bucket_is_refused_under_its_epoch_for_the_hold():
    clock = Clock()
    held = lease(clock)
    held.applied("c1:1")
    held.answered(100.0, answer("c1:1", seconds=60))
    held.resign("k", 4, hold=5.0)
    with pytest.raises(NotLeaderError, match="resigned its leadership under epoch 4"):
        held.check("k", 4, "b")
    held.check("k", 5, "b")  # it leads again under a later epoch
    held.check("other", 4, "b")
    clock.now += 5.0
    held.check("k", 4, "b")  # the move never came: it leads again after the hold


# --- the coordinator's grants ------------------------------------------------------------

def test_a_new_coordinator_counts_every_server_as_granted_at_its_start():
    clock = Clock()
    grants = LeaseGrants(3.0, clock=clock)
    assert grants.lease_seconds < grants.session_timeout
    assert grants.held("never-heard")
    clock.now += 3.0
    assert not grants.held("never-heard")


def test_a_grant_holds_for_the_session_timeout_and_a_gone_process_holds_none():
    clock = Clock()
    grants = LeaseGrants(3.0, clock=clock)
    clock.now += 10
    with grants.granting("ts-1", clock.now - 0.5) as seconds:
        assert seconds == grants.lease_seconds
    assert grants.held_until("ts-1") == clock.now - 0.5 + 3.0
    clock.now += 2.4
    assert grants.held("ts-1")
    grants.end("ts-1")  # its port refuses connections
    assert not grants.held("ts-1")
    with grants.granting("ts-1", clock.now):  # a new process heartbeats
        pass
    assert grants.held("ts-1")


def test_an_election_frees_only_expired_leases_and_grants_nothing_meanwhile():
    clock = Clock()
    grants = LeaseGrants(3.0, clock=clock)
    clock.now += 10
    with grants.granting("fresh", clock.now):
        pass
    with grants.deposing({"fresh", "silent"}) as free:
        assert free == {"silent"}
        with grants.granting("silent", clock.now) as seconds:
            assert seconds is None  # an answer now would carry the version before the change
    with grants.granting("silent", clock.now) as seconds:
        assert seconds == grants.lease_seconds


def test_the_server_lease_ends_before_the_coordinator_deposes():
    """Both clocks run at one rate here; the tablet's lease, counted from the send, ends
    before the coordinator's grant, counted from the arrival, for the longer timeout."""
    clock = Clock()
    grants = LeaseGrants(3.0, clock=clock)
    held = lease(clock)
    held.applied("c:1")
    clock.now += 10
    sent = clock.now
    clock.now += 0.3  # in flight
    with grants.granting("ts-1", clock.now) as seconds:
        reply = answer("c:1", seconds)
    clock.now += 0.4
    held.answered(sent, reply)
    while grants.held("ts-1"):
        clock.now += 0.01
    assert not held.valid()


# --- a model of the lease ------------------------------------------------------------------

versions = st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 4)).map(lambda v: f"{v[0]}:{v[1]}")
events = st.lists(st.one_of(
    st.tuples(st.just("answer"), st.floats(0, 3), versions, st.sampled_from([0, 1.0, 2.0])),
    st.tuples(st.just("applied"), versions),
    st.tuples(st.just("wait"), st.floats(0, 2)),
), max_size=PENDING_ANSWERS)


@settings(max_examples=300, deadline=None)
@given(events)
def test_the_lease_holds_exactly_when_a_covered_answer_still_runs(script):
    """Model: the lease holds at t iff some answer (sent at S granting `s` seconds) has
    t < S + s and its version is covered by the roles applied when it arrived or later."""
    clock = Clock(0.0)
    held = lease(clock)
    applied: list[str] = []          # every version applied, in order
    answers: list[tuple[float, str, float, int]] = []  # (sent, version, seconds, applied so far)
    for event in script:
        if event[0] == "answer":
            _, age, version, seconds = event
            sent = clock.now - age
            held.answered(sent, answer(version, seconds))
            answers.append((sent, version, seconds, len(applied)))
        elif event[0] == "applied":
            held.applied(event[1])
            applied.append(event[1])
        else:
            clock.now += event[1]
        t = clock.now
        expected = any(
            t < sent + seconds and seconds > 0
            and any(covers(v, version) for v in applied[max(0, seen - 1):])
            for sent, version, seconds, seen in answers)
        assert held.valid() == expected, (event, answers, applied)
