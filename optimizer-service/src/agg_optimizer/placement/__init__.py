"""Where each job aggregates: `engine.solve` (AGG's LP on HiGHS and its family, the
baselines, the MILP oracle), the shared-fabric prediction, the local search after the LP
and the exact optimum of small instances. Built on `model` and the simulator (`sim`)."""
