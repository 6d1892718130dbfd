import pytest
from hypothesis import given
from hypothesis import strategies as st

from agg_agent.protocol import LANES, PACKET_BYTES, AggPacket, PacketError

int32 = st.integers(-(2**31), 2**31 - 1)


@given(
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFFFF),
    st.integers(0, 31),
    st.integers(0, 255),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 255),
    st.lists(int32, min_size=LANES, max_size=LANES),
    st.integers(0, 255),
    st.integers(0, 2**32 - 1),
)
def test_round_trip(
    job, slot, worker, fan_in, seq, contributors, flags, values, queue, run
) -> None:
    p = AggPacket(job, slot, worker, fan_in, seq, contributors, flags, tuple(values), queue, run)
    data = p.encode()
    assert len(data) == PACKET_BYTES == 20 + 4 * LANES
    assert AggPacket.decode(data) == p


def test_layout_matches_the_documented_example() -> None:
    # docs/protocols.md, "Example packets": worker 2 of job 7, seq 5 in slot 5, run 0x1234abcd.
    p = AggPacket(7, 5, 2, 3, 5, 0b100, 0, (1, -1, *([0] * (LANES - 2))), run=0x1234ABCD)
    assert p.encode()[:28].hex() == ("000700050203000000000004000000051234abcd00000001ffffffff")


@pytest.mark.parametrize(
    ("field", "value"),
    [("job_id", 70000), ("worker_id", 32), ("slot", -1), ("seq", 2**32), ("run", -1)],
)
def test_bad_field_is_named(field: str, value: int) -> None:
    p = AggPacket(1, 0, 0, 1, 0, 1)
    setattr(p, field, value)
    with pytest.raises(PacketError, match=field):
        p.encode()


def test_short_datagram_is_rejected() -> None:
    with pytest.raises(PacketError, match="length: 20 B"):
        AggPacket.decode(bytes(20))


@given(st.integers(1, 256), st.integers(0, 2**31 - 1))
def test_a_chunk_of_any_allowed_size_round_trips(k: int, seed: int) -> None:
    """`LANES * k` values a packet (k = 1..256): one format, its size told by its length."""
    values = tuple((seed * (i + 1)) % 2**32 - 2**31 for i in range(LANES * k))
    p = AggPacket(3, 1, 0, 2, 9, 1, values=values, run=5)
    data = p.encode()
    assert len(data) == 20 + 4 * LANES * k
    assert AggPacket.decode(data) == p


@pytest.mark.parametrize("values", [LANES - 1, LANES + 1, 8192 + LANES])
def test_a_size_outside_the_format_is_refused_both_ways(values: int) -> None:
    with pytest.raises(PacketError, match="values"):
        AggPacket(1, 0, 0, 1, 0, 1, values=(0,) * values).encode()
    with pytest.raises(PacketError, match="length"):
        AggPacket.decode(bytes(20 + 4 * values))
