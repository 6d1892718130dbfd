"""The vocabulary every layer shares: the documents (instances, placements, telemetry),
topologies and example instances, the network model (routes, trees, predicted CCT), the
checks an instance must pass, and the switches' slot pools. Imports nothing of the other
layers."""
