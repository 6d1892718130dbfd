"""`agg-optimizer`: solve, compare, optimum, peers, schema, example, demo, evaluate, serve.

Errors in the input end the program with status 2 and one line naming the field. Each
module registers its commands on `app`; libraries are imported by the command that needs
them, so `--help` loads none of the solvers (docs/benchmarks/cli.md).
"""

from agg_optimizer.cli import place, serve, simulate  # noqa: F401  (they register commands)
from agg_optimizer.cli.common import STRATEGY_NAMES, UserError, app, main

__all__ = ["STRATEGY_NAMES", "UserError", "app", "main"]
