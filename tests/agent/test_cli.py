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
