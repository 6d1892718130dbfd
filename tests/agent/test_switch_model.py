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


def test_a_restarted_run_never_adds_to_what_its_killed_run_left() -> None:
    """Run A of job 7 dies after worker 0 sent chunk 5 (its slot keeps that partial sum);
    run B of the same job starts from seq 0. What reaches the PS for B's chunk 5 must be B's
    two workers' values and nothing of A's."""
    model = SwitchModel({7: JobConfig(pool_base=0, pool_size=8, fan_in=2)})

    def pkt(worker: int, seq: int, value: int, run: int) -> AggPacket:
        return AggPacket(7, seq % 8, worker, 2, seq, 1 << worker, 0, (value,) * LANES, run=run)

    assert model.process(pkt(0, 5, 1000, run=0xA)) is Verdict.ABSORBED  # run A, then killed
    at_ps: dict[int, tuple[int, int]] = {}  # seq -> (contributors, sum of lane 0)
    for seq in range(6):  # run B
        for worker, value in ((1, 20), (0, 10)):
            p = pkt(worker, seq, value, run=0xB)
            if model.process(p) in (Verdict.EMIT, Verdict.FORWARD, Verdict.FLUSH):
                bits, total = at_ps.get(seq, (0, 0))
                if not bits & p.contributors:
                    at_ps[seq] = (bits | p.contributors, total + p.values[0])
    assert at_ps[5] == (0b11, 30), at_ps[5]


def test_a_late_packet_of_a_killed_run_never_mixes_with_the_new_runs_sum() -> None:
    """A straggler of run A reaching a slot that holds run B's partial sum: the slot is
    claimed again (B's partial sum is lost, never mixed); B's sender retransmits on its timer
    and the chunk completes with B's values only. A's aggregate, were A's chunk to complete,
    carries run A, which B's parameter server drops."""
    model = SwitchModel({7: JobConfig(pool_base=0, pool_size=8, fan_in=2)})

    def pkt(worker: int, value: int, run: int, flags: int = 0) -> AggPacket:
        return AggPacket(7, 3, worker, 2, 3, 1 << worker, flags, (value,) * LANES, run=run)

    assert model.process(pkt(0, 10, run=0xB)) is Verdict.ABSORBED
    assert model.process(pkt(1, 999, run=0xA)) is Verdict.ABSORBED  # the straggler
    done = pkt(1, 20, run=0xB)
    assert model.process(done) is Verdict.ABSORBED  # B's worker 0 is gone from the slot
    again = pkt(0, 10, run=0xB, flags=FLAG_RETRANSMIT)
    assert model.process(again) is Verdict.EMIT
    assert (again.values[0], again.contributors, again.run) == (30, 0b11, 0xB)


def test_joins_pass_every_switch_unchanged(sw: SwitchModel) -> None:
    from agg_agent.protocol import FLAG_JOIN

    hello = pkt(0, flags=FLAG_JOIN)
    assert sw.process(hello) is Verdict.FORWARD
    assert sw.slots[10].count == 0
