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
)
def test_round_trip(job, slot, worker, fan_in, seq, contributors, flags, values) -> None:
    p = AggPacket(job, slot, worker, fan_in, seq, contributors, flags, tuple(values))
    data = p.encode()
    assert len(data) == PACKET_BYTES == 16 + 4 * LANES
    assert AggPacket.decode(data) == p


def test_layout_matches_the_documented_example() -> None:
    # docs/protocols.md, "Example packets": worker 2 of job 7, seq 5 in slot 5.
    p = AggPacket(7, 5, 2, 3, 5, 0b100, 0, (1, -1, *([0] * (LANES - 2))))
    assert p.encode()[:24].hex() == "0007000502030000000000040000000500000001ffffffff"


@pytest.mark.parametrize(
    ("field", "value"), [("job_id", 70000), ("worker_id", 32), ("slot", -1), ("seq", 2**32)]
)
def test_bad_field_is_named(field: str, value: int) -> None:
    p = AggPacket(1, 0, 0, 1, 0, 1)
    setattr(p, field, value)
    with pytest.raises(PacketError, match=field):
        p.encode()


def test_short_datagram_is_rejected() -> None:
    with pytest.raises(PacketError, match="length: 20 B"):
        AggPacket.decode(bytes(20))
