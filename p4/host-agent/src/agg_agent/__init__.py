"""Host endpoints of the in-network aggregation protocol (docs/protocols.md)."""
