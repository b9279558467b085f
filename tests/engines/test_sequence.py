"""Gap detection on numbered KV-event batches."""

from __future__ import annotations

from kvplane.dataplane.engines.external.sequence import Check, Sequencer, Verdict


def test_in_order_gap_duplicate_and_restart():
    s = Sequencer()
    assert s.check_live(0) == Check(Verdict.APPLY)
    s.applied(0, ts=1.0)
    assert s.check_live(1) == Check(Verdict.APPLY)
    assert s.check_live(4) == Check(Verdict.GAP, missing_from=1)
    s.applied(4, ts=5.0)
    assert s.check_live(4, ts=5.0) == Check(Verdict.DUPLICATE)  # a replay applied it before the live copy came
    assert s.check_live(0, ts=9.0) == Check(Verdict.RESTART)  # a new publisher counts from 0
    s.reset()
    assert s.next_seq is None


def test_a_first_batch_past_zero_is_a_gap_from_zero():
    assert Sequencer().check_live(12) == Check(Verdict.GAP, missing_from=0)


def test_replayed_batches():
    s = Sequencer()
    s.applied(2)
    assert s.check_replayed(1) == Check(Verdict.DUPLICATE)
    assert s.check_replayed(3) == Check(Verdict.APPLY)
    assert s.check_replayed(5) == Check(Verdict.GAP, missing_from=3)  # the buffer no longer reaches back
