"""What every command shares: the Typer app, loading an instance, writing output, and
`main`, which turns every error a user can cause into one line with exit status 2."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

# Everything else is imported by the command that needs it: a command pays only for its own
# libraries (numpy, scipy, networkx, highspy and pydantic's models take about 1.7 s together
# on a small machine; `--help` needs none of them). docs/benchmarks/cli.md.
if TYPE_CHECKING:
    from rich.console import Console

    from agg_optimizer.model.documents import Instance

# (tests/optimizer/test_cli_compare.py checks the two agree).
STRATEGY_NAMES = (
    "agg", "agg-mm", "agg-own", "ps", "switchml", "atp", "sharp", "soar", "grid", "random",
    "greedy", "milp", "greedy-rr",
)  # fmt: skip

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Place in-network aggregation for training jobs from INT telemetry.",
)


def make_console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr)


class UserError(Exception):
    """A problem with what the user gave us; printed as one line."""


def load(path: Path) -> Instance:
    from pydantic import ValidationError

    from agg_optimizer.model.documents import Instance
    from agg_optimizer.model.validation import describe_validation_error

    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    try:
        return Instance.model_validate_json(text)
    except ValidationError as e:
        raise UserError(f"{path}: {describe_validation_error(e)}") from None


def write(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text + "\n")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def out_dir(path: Path) -> Path:
    if path.exists() and not path.is_dir():
        raise UserError(f"--output: {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--output: cannot create {path} ({e.strerror})") from None
    return path


def _usage_line(e: Exception) -> str:
    """Click's usage errors in our one form, `FIELD: problem`, instead of its framed box."""
    from typer._click.exceptions import BadParameter, MissingParameter, NoSuchOption

    param = getattr(e, "param", None)
    field = ""
    if param is not None:
        opts = [o for o in getattr(param, "opts", []) if o.startswith("--")]
        field = opts[0] if opts else (param.name or "").upper()
    msg = getattr(e, "message", str(e))
    if isinstance(e, MissingParameter):
        msg = "missing"
    elif isinstance(e, NoSuchOption):
        field, msg = e.option_name, "no such option"
        if e.possibilities:
            msg += f"; did you mean {', '.join(sorted(e.possibilities))}?"
    elif isinstance(e, BadParameter) and field:
        msg = e.message
    elif msg.startswith("No such command"):
        field, msg = "COMMAND", "n" + msg[1:].rstrip(".")
    ctx = getattr(e, "ctx", None)
    where = ctx.command_path if ctx is not None else "agg-optimizer"
    return f"{field + ': ' if field else ''}{msg} (try '{where} --help')"


def main() -> None:
    """Every error a user can cause is one line, `agg-optimizer: error: FIELD: problem`,
    with exit status 2."""
    # Typer (pinned in uv.lock) vendors click; its usage errors are not re-exported.
    from typer import Abort
    from typer._click.exceptions import UsageError

    try:
        code = app(prog_name="agg-optimizer", standalone_mode=False)
    except UsageError as e:
        print(f"agg-optimizer: error: {_usage_line(e)}", file=sys.stderr)
        sys.exit(2)
    except (UserError, ValueError) as e:  # validation.InstanceError is a ValueError
        print(f"agg-optimizer: error: {e}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as e:  # flow_lp.SolveError: the solver failed, not the input
        print(f"agg-optimizer: error: solver: {e}", file=sys.stderr)
        sys.exit(1)
    except (Abort, KeyboardInterrupt):
        print("agg-optimizer: interrupted", file=sys.stderr)
        sys.exit(130)
    if isinstance(code, int) and code:
        sys.exit(code)
