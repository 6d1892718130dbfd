"""The store on both backends: SQLite (the embedded default) and PostgreSQL (replicas; a
real server, `pgserver.py`). Two `Store`s on one database stand for two replicas: each
sees the other's writes and version, the lease goes to one holder at a time on the
database's clock, a holder whose session ended is known gone (PostgreSQL), and the apply
lock lets one holder in at a time across them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agg_optimizer.service.store import CONVERGED, DELETING, PENDING, Store, StoreUnavailable

from . import pgserver


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pgserver.PgServer]:
    if (reason := pgserver.skip_reason()) is not None:
        pytest.skip(reason)
    with pgserver.PgServer(tmp_path_factory.mktemp("pg")) as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "state.sqlite")
    pg: pgserver.PgServer = request.getfixturevalue("pg")
    # a database of its own per test
    import psycopg

    name = f"t{time.monotonic_ns()}"
    admin = pg.url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return pg.url.rsplit("/", 1)[0] + "/" + name


def test_two_stores_share_writes_and_the_version(target: str) -> None:
    a, b = Store(target), Store(target)
    assert a.store_id == b.store_id
    v0 = b.version
    a.add_job("j", {"id": "j", "workers": ["h1"]}, "agg")
    assert b.version > v0
    assert b.job("j") == {"id": "j", "workers": ["h1"], "strategy": "agg"}
    with pytest.raises(Exception):  # noqa: B017 (sqlite3 or psycopg's own)
        b.add_job("j", {}, "agg")  # one id, whichever replica
    g1 = a.set_desired("j", "agg", {"v": 1}, {})
    g2 = b.set_desired("j", "agg", {"v": 2}, {"k": {}})
    assert (g1, g2) == (1, 2)
    assert a.desired("j")["j"]["state"] == PENDING
    a.converge("j", g1, "agg", "applied", None, {"v": 1})  # stale generation: stays pending
    assert b.desired("j")["j"]["state"] == PENDING
    seq = b.converge("j", g2, "agg", "applied", None, {"v": 2})
    assert a.desired("j")["j"]["state"] == CONVERGED
    assert a.current("j")["seq"] == seq and a.current("j")["placement"] == {"v": 2}
    a.own_intent("k", "j", {"x": 1})
    assert b.intents() == {"k": ("j", "-")}
    b.confirm_intent("k", "d")
    a.retire_intent("k")
    assert b.intents() == {} and b.owned() == {"k": ("j", True)}
    b.mark_deleting("j")
    assert a.desired("j")["j"]["state"] == DELETING
    v = a.version
    a.delete_job("j")
    assert b.job("j") is None and b.placements("j") == [] and b.version == v + 1
    a.close()
    b.close()


def test_decoded_rows_are_kept_per_version_and_dropped_on_another_stores_write(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every job's spec, current placement and desired row are decoded once per version;
    a write through another Store on the same database (another replica) moves the
    version, and the next read decodes the rows again."""
    import agg_optimizer.service.store as store_mod

    a, b = Store(target), Store(target)
    for i in range(3):
        a.add_job(f"j{i}", {"id": f"j{i}", "workers": ["h1"]}, "agg")
    a.add_placement("j0", "agg", "applied", None, {"v": 0})
    a.set_desired("j0", "agg", {"v": 0}, {})
    decoded = []
    real = store_mod.json.loads
    monkeypatch.setattr(store_mod.json, "loads", lambda s: decoded.append(s) or real(s))

    def reads() -> tuple:
        return b.jobs(), b.currents(), b.desired()

    first = reads()
    n = len(decoded)
    assert n == 3 + 1 + 2  # three specs, one placement, one desired row (doc and bodies)
    assert reads() == first and len(decoded) == n  # the same version: nothing decoded
    first[0][0]["strategy"] = "mutated"  # callers get copies: the cache is not theirs
    first[1]["j0"]["status"] = "mutated"
    assert b.jobs()[0]["strategy"] == "agg" and b.currents()["j0"]["status"] == "applied"
    assert len(decoded) == n

    a.set_strategy("j1", "greedy")  # the other replica writes
    assert [j["strategy"] for j in b.jobs()] == ["agg", "greedy", "agg"]
    assert len(decoded) > n
    a.add_placement("j1", "greedy", "failed", "x", {"v": 1})
    a.add_placement("j0", "agg", "applied", None, {"v": 2})
    assert {j: c["placement"] for j, c in b.currents().items()} == {"j0": {"v": 2}, "j1": {"v": 1}}
    assert b.currents()["j0"] == b.current("j0")
    a.set_desired_state("j0", CONVERGED)
    assert b.desired()["j0"]["state"] == CONVERGED
    a.delete_job("j2")
    assert [j["id"] for j in b.jobs()] == ["j0", "j1"]
    a.close()
    b.close()


def test_unsettled_jobs_are_read_without_decoding_and_match_the_decoded_rows(
    target: str,
) -> None:
    """`Store.unsettled` (the loop's question after a pass): jobs whose latest placement has
    one of the statuses, those being deleted left out; the same jobs as `currents()` and
    `deleting()` give, on either backend."""
    a, b = Store(target), Store(target)
    statuses = {"j1": ["partial"], "j2": ["partial", "applied"], "j3": ["applied", "intents-only"]}
    statuses |= {"j4": ["intents-only"], "j5": []}
    for j, seen in statuses.items():
        a.add_job(j, {"id": j, "workers": ["h1"]}, "agg")
        a.set_desired(j, "agg", {}, {})
        for st in seen:
            a.add_placement(j, "agg", st, None, {"s": st})
    b.mark_deleting("j4")
    want = sorted(
        j for j, c in b.currents().items()
        if c["status"] in ("partial", "intents-only") and j not in b.deleting()
    )  # fmt: skip
    assert want == ["j1", "j3"]
    assert b.unsettled(("partial", "intents-only")) == want
    assert a.unsettled(("applied",)) == ["j2"]
    a.close()
    b.close()


def test_the_lease_has_one_holder_on_the_database_clock(target: str) -> None:
    a, b = Store(target), Store(target)
    ours, holder, expires = a.acquire_lease("fabric:x", "a", 1.0)
    assert ours and holder == "a"
    assert expires == pytest.approx(time.time() + 1.0, abs=5.0)  # the same clock here
    assert b.acquire_lease("fabric:x", "b", 1.0)[:2] == (False, "a")
    assert a.acquire_lease("fabric:x", "a", 1.0)[0]  # renewed
    assert b.acquire_lease("fabric:y", "b", 1.0)[0]  # another fabric: its own leader
    time.sleep(1.3)
    assert b.acquire_lease("fabric:x", "b", 30.0)[:2] == (True, "b")  # expired: taken
    assert a.acquire_lease("fabric:x", "a", 1.0)[:2] == (False, "b")
    a.close()
    b.close()


def test_a_holder_whose_session_ended_is_known_gone(pg: pgserver.PgServer) -> None:
    a, b = Store(pg.url), Store(pg.url)
    assert a.acquire_lease("fabric:z", "a", 60.0)[0]
    assert not b.lease_session_gone("fabric:z", "a")
    a.close()  # as a SIGKILLed replica's sessions end

    def gone() -> bool:
        return b.lease_session_gone("fabric:z", "a")

    deadline = time.monotonic() + 30
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone()
    b.close()


def test_the_apply_lock_lets_one_in_at_a_time_across_stores(target: str) -> None:
    stores = [Store(target), Store(target)]
    inside: list[int] = []
    overlap: list[int] = []

    def work(i: int) -> None:
        for _ in range(5):
            with stores[i].apply_lock("fabric:x"):
                inside.append(i)
                if len(inside) > 1:
                    overlap.append(i)
                time.sleep(0.01)
                inside.remove(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlap == []
    # another fabric's lock is another lock
    with stores[0].apply_lock("fabric:x"):
        done = threading.Event()
        threading.Thread(target=lambda: (stores[1].apply_lock("fabric:y").__enter__(),
                                         done.set())).start()  # fmt: skip
        assert done.wait(10)
    for s in stores:
        s.close()


def test_postgres_down_is_unavailable_then_recovers(tmp_path: Path) -> None:
    if (reason := pgserver.skip_reason()) is not None:
        pytest.skip(reason)
    with pgserver.PgServer(tmp_path, "pg-down") as server:
        s = Store(server.url)
        s.add_job("j", {"id": "j"}, "agg")
        server.kill()
        with pytest.raises(StoreUnavailable, match="PostgreSQL at postgresql://innetagg@"):
            s.jobs()
        with pytest.raises(StoreUnavailable) as e:
            s.add_job("k", {"id": "k"}, "agg")
        assert server.password not in str(e.value)
        server.start()
        assert [j["id"] for j in s.jobs()] == ["j"]
        s.close()


def _pool_doc(jid: str, lo: int, hi: int) -> dict:
    return {
        "job_id": jid,
        "aggregators": [{"switch": "leaf1", "pool": {"base": lo, "size": hi - lo}}],
    }


def test_two_replicas_never_both_record_overlapping_pools(target: str) -> None:
    """Two replicas record two jobs' pools on the same slots at once, many times, each past
    its own check (the other's row is not visible to it yet in PostgreSQL): the database's
    constraint lets exactly one through, and the other is told which jobs clash."""
    from agg_optimizer.service.errors import PoolConflict

    a, b = Store(target), Store(target)
    for round_ in range(30):
        ja, jb = f"a{round_}", f"b{round_}"
        a.add_job(ja, {"id": ja}, "agg")
        a.add_job(jb, {"id": jb}, "agg")
        start = threading.Barrier(2)
        got: dict[str, str] = {}

        def put(
            store: Store, jid: str, lo: int, start: threading.Barrier = start, got: dict = got
        ) -> None:
            start.wait()
            try:
                store.set_desired(jid, "agg", _pool_doc(jid, lo, lo + 128), {})
                got[jid] = "ok"
            except PoolConflict as e:
                got[jid] = str(e)

        ts = [
            threading.Thread(target=put, args=(a, ja, 0)),
            threading.Thread(target=put, args=(b, jb, 64)),
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert sorted(got.values()).count("ok") == 1, got
        assert a.overlaps() == [] and b.overlaps() == []
        for jid in (ja, jb):
            a.delete_job(jid)
    # A row written past the store's own check is refused by the database itself.
    a.add_job("x", {"id": "x"}, "agg")
    a.set_desired("x", "agg", _pool_doc("x", 0, 128), {})
    with pytest.raises(PoolConflict):
        a._db.run("INSERT INTO pools VALUES ('y', 'leaf1', 100, 200)")
