"""The optimizer REST service: jobs in, placements applied to ONOS as intents, kept right."""
