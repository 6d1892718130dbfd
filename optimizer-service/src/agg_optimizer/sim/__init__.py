"""Flow-level simulation of training jobs' gradient aggregation on a shared fabric: max-min
fair sharing, streaming aggregation with slot pools, background traffic and INT as the
strategies see it. The scenarios built on it are in `agg_optimizer.evaluation`."""
