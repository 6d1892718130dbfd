from typer.testing import CliRunner

from agg_agent.cli import app

runner = CliRunner()


def test_bad_address_is_named() -> None:
    r = runner.invoke(app, ["worker", "--worker-id", "0", "--ps", "10.0.0.4:http"])
    assert r.exit_code == 2
    assert "--ps: '10.0.0.4:http' is not host:port" in r.output


def test_worker_id_beyond_the_job_is_refused() -> None:
    r = runner.invoke(app, ["worker", "--worker-id", "3", "--workers", "2", "--ps", "127.0.0.1"])
    assert r.exit_code == 2
    assert "worker_id: 3 outside 0..1" in r.output


RUN = 77  # the run the tests' packets carry (`agg-agent ps --run`)


class _Ps:
    """`agg-agent ps` of job 7 (one chunk an iteration) on loopback, for two workers whose
    sockets the test holds; `send(w)` sends worker w's chunk of iteration 0."""

    def __init__(self, *args: str) -> None:
        import socket
        import subprocess
        import sys
        import time
        from pathlib import Path

        from agg_agent.protocol import LANES

        self.socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
        for sk in self.socks:
            sk.bind(("127.0.0.1", 0))
            sk.settimeout(60)
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        agent = str(Path(sys.executable).parent / "agg-agent")
        workers = [f"--worker-addr=127.0.0.1:{sk.getsockname()[1]}" for sk in self.socks]
        self.proc = subprocess.Popen(
            [agent, "ps", "--job", "7", "--size", str(LANES), "--run", str(RUN),
             "--bind", f"127.0.0.1:{self.port}", *args, *workers],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60  # the PS binds once Python has started
        while not subprocess.run(["ss", "-Hunl", f"sport = :{self.port}"], capture_output=True,
                                 text=True).stdout.strip():  # fmt: skip
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"ps: {self.proc.communicate()}")
            time.sleep(0.05)

    def send(self, w: int, flags: int = 0) -> None:
        from agg_agent.protocol import LANES, AggPacket

        pkt = AggPacket(7, 0, w, 2, 0, 1 << w, flags, (10 + w,) * LANES, run=RUN)
        self.socks[w].sendto(pkt.encode(), ("127.0.0.1", self.port))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for sk in self.socks:
            sk.close()


def test_the_ps_answers_a_lost_last_acknowledgement_for_linger_s() -> None:
    """`agg-agent ps --linger-s`: after its last iteration the PS still answers a worker
    that retransmits once its timer fires (its acknowledgement lost), here 1 s later,
    beyond the default 0.3 s, then exits by itself."""
    import time

    from agg_agent.protocol import LANES, AggPacket

    ps = _Ps("--iterations", "1", "--linger-s", "5")
    try:
        ps.send(0)
        ps.send(1)
        assert {AggPacket.decode(sk.recv(2048)).values for sk in ps.socks} == {(21,) * LANES}
        time.sleep(1.0)  # the last acknowledgement "lost": worker 0 retransmits later
        ps.send(0, flags=0x02)
        again = AggPacket.decode(ps.socks[0].recv(2048))
        assert (again.seq, again.values) == (0, (21,) * LANES)
        out, err = ps.proc.communicate(timeout=60)
        assert ps.proc.returncode == 0, err
        assert '"iteration": 0' in out
    finally:
        ps.close()


def test_a_training_jobs_ps_reports_each_iteration_as_it_completes() -> None:
    """`agg-agent ps --iterations 0` (a training job's PS, until SIGTERM) prints each
    iteration's line when it completes, not all of them when it stops: a harness follows
    the job's progress (it printed nothing until SIGTERM before)."""
    import json
    import select
    import signal

    ps = _Ps("--iterations", "0")
    try:
        ps.send(0)
        ps.send(1)
        assert ps.proc.stdout is not None
        ready, _, _ = select.select([ps.proc.stdout], [], [], 60)
        assert ready and ps.proc.poll() is None, "no line while the PS runs"
        row = json.loads(ps.proc.stdout.readline())
        assert (row["iteration"], row["raw_packets"], row["aggregated_packets"]) == (0, 2, 0)
        ps.proc.send_signal(signal.SIGTERM)
        out, err = ps.proc.communicate(timeout=60)
        assert ps.proc.returncode == 0, err
        assert out == ""  # nothing printed twice at the end
    finally:
        ps.close()
