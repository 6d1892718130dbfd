"""Strategies simulated on seeds: scenarios (`scenario.run`), the paper's evaluation
(`evaluate`), and the placements' validity on the simulated fabric."""
