"""One module per speculative method; each registers its ``Proposer`` subclass on import."""
