"""The reference model's decisions, one per branch of p4/include/aggregation.p4."""

import pytest

from agg_agent.protocol import FLAG_ACK, FLAG_AGGREGATED, FLAG_RETRANSMIT, LANES, AggPacket
from agg_agent.switch_model import JobConfig, SwitchModel, Verdict


def pkt(worker: int, seq: int = 0, slot: int = 0, job: int = 1, flags: int = 0) -> AggPacket:
    return AggPacket(job, slot, worker, 3, seq, 1 << worker, flags, (worker + 1,) * LANES)


@pytest.fixture
def sw() -> SwitchModel:
    return SwitchModel({1: JobConfig(pool_base=10, pool_size=4, fan_in=3)})


def test_fan_in_contributions_make_one_aggregate_and_free_the_slot(sw: SwitchModel) -> None:
    assert sw.process(pkt(0)) is Verdict.ABSORBED
    assert sw.process(pkt(1)) is Verdict.ABSORBED
    last = pkt(2)
    assert sw.process(last) is Verdict.EMIT
    assert last.values == (6,) * LANES
    assert last.contributors == 0b111
    assert last.flags & FLAG_AGGREGATED
    s = sw.slots[10]
    assert (s.count, s.bitmap, s.values) == (0, 0, [0] * LANES)


def test_retransmission_is_counted_once(sw: SwitchModel) -> None:
    sw.process(pkt(0))
    assert sw.process(pkt(0)) is Verdict.DUPLICATE  # e.g. duplicated by the network
    sw.process(pkt(1))
    last = pkt(2, flags=FLAG_RETRANSMIT)
    assert sw.process(last) is Verdict.EMIT
    assert last.values == (6,) * LANES
    assert not last.flags & FLAG_RETRANSMIT


def test_retransmission_of_a_contributor_in_the_slot_flushes_the_partial_sum(
    sw: SwitchModel,
) -> None:
    sw.process(pkt(0))
    sw.process(pkt(1))
    again = pkt(0, flags=FLAG_RETRANSMIT)
    assert sw.process(again) is Verdict.FLUSH
    assert again.values == (3,) * LANES and again.contributors == 0b11
    assert again.flags == FLAG_AGGREGATED | FLAG_RETRANSMIT
    s = sw.slots[10]
    assert (s.count, s.bitmap, s.values, s.seq_tag) == (0, 0, [0] * LANES, 1)
    # The straggler's packet then goes up raw, as after a completion.
    late = pkt(2)
    assert sw.process(late) is Verdict.FORWARD and late.values == (3,) * LANES


def test_lost_acknowledgement_during_a_move_does_not_deadlock() -> None:
    """docs/e2e.md: chunk 5 completes at sp2; the PS's acknowledgement to worker 0 is lost
    while the job moves to sp1; worker 1 got its own and never sends 5 again."""
    sp1, sp2 = (SwitchModel({1: JobConfig(0, 8, 2)}) for _ in range(2))
    assert sp2.process(pkt(0, seq=5, slot=5)) is Verdict.ABSORBED
    assert sp2.process(pkt(1, seq=5, slot=5)) is Verdict.EMIT
    first = pkt(0, seq=5, slot=5, flags=FLAG_RETRANSMIT)
    assert sp1.process(first) is Verdict.ABSORBED  # claims sp1's free slot
    second = pkt(0, seq=5, slot=5, flags=FLAG_RETRANSMIT)
    # Dropped as a duplicate before: worker 0 waited for good. Now it reaches the PS,
    # which acknowledges the chunk it completed again.
    assert sp1.process(second) is Verdict.FLUSH and second.contributors == 0b1
    # Worker 1, ahead, reuses the slot: the stale claim does not block it.
    assert sp1.process(pkt(1, seq=13, slot=5)) is Verdict.ABSORBED
    last = pkt(0, seq=13, slot=5)
    assert sp1.process(last) is Verdict.EMIT and last.values == (3,) * LANES


def test_a_newer_chunk_discards_what_the_slot_holds(sw: SwitchModel) -> None:
    sw.process(pkt(0, seq=0))  # chunk 0 never completes here (e.g. the job moved)
    assert sw.process(pkt(1, seq=4)) is Verdict.ABSORBED
    assert sw.process(pkt(0, seq=4)) is Verdict.ABSORBED
    last = pkt(2, seq=4)
    assert sw.process(last) is Verdict.EMIT
    assert last.values == (6,) * LANES and last.contributors == 0b111


def test_an_older_chunk_passes_a_busy_slot_unchanged(sw: SwitchModel) -> None:
    sw.process(pkt(0, seq=4))
    old = pkt(1, seq=0)
    assert sw.process(old) is Verdict.FORWARD and old.values == (2,) * LANES
    assert sw.slots[10].bitmap == 0b1


def test_sequence_numbers_compare_across_the_wrap() -> None:
    sw = SwitchModel({1: JobConfig(0, 4, 2)})
    top = 2**32 - 4  # slot 0 of a window of 4
    sw.process(pkt(0, seq=top))
    assert sw.process(pkt(1, seq=0)) is Verdict.ABSORBED  # 4 after top, modulo 2^32
    assert sw.process(pkt(0, seq=top)) is Verdict.FORWARD  # now the older one


def test_late_retransmission_of_a_completed_chunk_passes_through(sw: SwitchModel) -> None:
    for w in range(3):
        sw.process(pkt(w))
    late = pkt(1, flags=FLAG_RETRANSMIT)
    assert sw.process(late) is Verdict.FORWARD
    assert late.values == (2,) * LANES  # unchanged: the PS may need it


def test_slot_reused_by_the_next_chunk(sw: SwitchModel) -> None:
    for w in range(3):
        sw.process(pkt(w, seq=0))
    for w in range(2):
        assert sw.process(pkt(w, seq=4)) is Verdict.ABSORBED
    last = pkt(2, seq=4)
    assert sw.process(last) is Verdict.EMIT and last.values == (6,) * LANES


def test_busy_slot_unconfigured_job_ack_and_out_of_pool_pass_through(sw: SwitchModel) -> None:
    sw.process(pkt(0, seq=4))
    assert sw.process(pkt(1, seq=0)) is Verdict.FORWARD
    assert sw.process(pkt(0, job=2)) is Verdict.FORWARD
    assert sw.process(pkt(0, flags=FLAG_ACK)) is Verdict.FORWARD
    assert sw.process(pkt(0, slot=4)) is Verdict.FORWARD


def test_sums_wrap_like_int32_registers() -> None:
    sw = SwitchModel({1: JobConfig(0, 1, 2)})
    a = AggPacket(1, 0, 0, 2, 0, 1, 0, (2**31 - 1,) * LANES)
    b = AggPacket(1, 0, 1, 2, 0, 2, 0, (1,) * LANES)
    sw.process(a)
    assert sw.process(b) is Verdict.EMIT
    assert b.values == (-(2**31),) * LANES


def test_pool_past_the_switch_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"jobs\[1\].pool"):
        SwitchModel({1: JobConfig(1020, 8, 2)})
