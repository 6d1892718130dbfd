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
    assert sw.process(pkt(0, flags=FLAG_RETRANSMIT)) is Verdict.DUPLICATE
    sw.process(pkt(1))
    last = pkt(2, flags=FLAG_RETRANSMIT)
    assert sw.process(last) is Verdict.EMIT
    assert last.values == (6,) * LANES
    assert not last.flags & FLAG_RETRANSMIT


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
    sw.process(pkt(0, seq=0))
    assert sw.process(pkt(1, seq=4)) is Verdict.FORWARD
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
