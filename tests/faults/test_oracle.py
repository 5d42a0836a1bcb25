"""The oracle against a plain-Python model of a table: it passes every outcome the promises
allow (each ambiguous write applied zero times or once) and catches every one they forbid (an
acknowledged write lost, any write applied twice, a read that goes back or misses an
acknowledged write, two leaders in one epoch)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.faults import oracle

outcomes = st.sampled_from([oracle.ACKED, oracle.AMBIGUOUS, oracle.REFUSED])
writes = st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True),
                            outcomes, st.booleans()), min_size=1, max_size=30)
# Without ambiguous writes: with them, a lost or doubled write can be indistinguishable from
# another ambiguous write applied or not (sum and count are all a key holds), so only these
# histories are certain to be caught.
certain = st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True),
                             st.sampled_from([oracle.ACKED, oracle.REFUSED]), st.booleans()),
                   min_size=1, max_size=30)


def history_and_table(spec):
    """The history of `spec` and the table it makes: acknowledged writes applied, ambiguous
    ones applied when their flag says so, refused ones never."""
    history = oracle.History()
    table: dict = {}
    for keys, outcome, applied in spec:
        w = history.begin(keys, 0)
        w.value = 1000 + w.id
        history.end(w, outcome)
        if outcome == oracle.ACKED or (outcome == oracle.AMBIGUOUS and applied):
            for k in keys:
                s, n = table.get(k, (0, 0))
                table[k] = (s + w.value, n + 1)
    return history, table


@settings(max_examples=200, deadline=None)
@given(writes)
def test_allowed_outcomes_pass(spec):
    history, table = history_and_table(spec)
    verdict = oracle.count_problems(history, table)
    assert verdict.problems == [] and verdict.lost == verdict.duplicated == 0


@settings(max_examples=200, deadline=None)
@given(certain, st.data())
def test_a_write_applied_twice_is_caught(spec, data):
    history, table = history_and_table(spec)
    applied = [w for w in history.writes if w.outcome != oracle.REFUSED]
    if not applied:
        return
    twice = data.draw(st.sampled_from(applied))
    for k in twice.keys:
        s, n = table.get(k, (0, 0))
        table[k] = (s + 2 * twice.value, n + 2)   # whether or not it was applied once already
    assert oracle.count_problems(history, table).problems


@settings(max_examples=200, deadline=None)
@given(certain, st.data())
def test_a_lost_acknowledged_write_is_caught(spec, data):
    history, table = history_and_table(spec)
    acked = [w for w in history.writes if w.outcome == oracle.ACKED]
    if not acked:
        return
    lost = data.draw(st.sampled_from(acked))
    for k in lost.keys:
        s, n = table[k]
        table[k] = (s - lost.value, n - 1)
    verdict = oracle.count_problems(history, table)
    assert verdict.problems


def test_reads_that_go_back_or_miss_an_acknowledgement_are_caught():
    watch = oracle.ReadWatch()
    watch.saw(1, (10, 1), (10, 1))
    watch.saw(1, (30, 2), (10, 1))
    assert watch.problems == []
    watch.saw(1, (10, 1), (10, 1))          # went back
    watch.saw(2, None, (5, 1))              # missed an acknowledged write
    assert len(watch.problems) == 2


def test_two_leaders_in_one_epoch_are_caught():
    watch = oracle.EpochWatch()
    watch.saw({0: {"leader": "a", "leader_epoch": 1}, 1: {"leader": None, "leader_epoch": 0}})
    watch.saw({0: {"leader": "b", "leader_epoch": 2}, 1: {"leader": "a", "leader_epoch": 0}})
    assert watch.problems == []
    watch.saw({0: {"leader": "a", "leader_epoch": 2}, 1: {"leader": "a", "leader_epoch": 0}})
    watch.saw({0: {"leader": "b", "leader_epoch": 1}, 1: {"leader": "a", "leader_epoch": 0}})
    assert len(watch.problems) == 3   # two leaders in epoch 2; epoch back to 1, whose leader was a


def test_expected_locked_counts_each_committed_epoch_once():
    want = oracle.expected_locked({"A": 1}, 40)
    rows = oracle.epoch_rows("A", 0, 40) + oracle.epoch_rows("A", 1, 40)
    assert sum(n for _, n in want.values()) == len(rows)
    assert sum(s for s, _ in want.values()) == sum(r["locked"] for r in rows)


def test_an_ambiguous_write_applied_twice_is_caught():
    """The double count of issue 37: a write refused as not acknowledged, replayed, and then
    both copies committed."""
    history = oracle.History()
    for outcome in (oracle.ACKED, oracle.AMBIGUOUS, oracle.AMBIGUOUS):
        w = history.begin([7], 0)
        w.value = 1000 + w.id
        history.end(w, outcome)
    assert oracle.count_problems(history, {7: (1000 + 2 * 1001, 3)}).duplicated == 1
    assert oracle.count_problems(history, {7: (1000 + 1001 + 1002, 3)}).problems == []
