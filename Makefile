# The README's two commands are `make demo` and `make test`; everything else serves them.
UV ?= uv
RUN := $(UV) run --frozen

.PHONY: all sync lint test demo bench-solve clean

all: test

sync:
	$(UV) sync --frozen

lint: sync
	$(RUN) ruff check .
	$(RUN) ruff format --check .

test: lint
	$(RUN) pytest

demo: sync
	$(RUN) agg-optimizer demo

# Build and solve time of AGG against the MILP oracle and networkx min-cost flow
# (writes docs/benchmarks/solve.md and the plot; see docs/benchmarks.md).
bench-solve: sync
	$(RUN) python optimizer-service/benchmarks/solve_bench.py --out docs/benchmarks

clean:
	rm -rf .venv .pytest_cache .ruff_cache
