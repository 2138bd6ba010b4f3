"""Speculative decoding: configuration, the proposer seam, verification and metrics."""
from .config import SpeculativeConfig
from .interface import (
           DraftBatch,
           ProposeBatch,
           Proposer,
           ProposerNeeds,
           register,
           registered_methods,
)

__all__ = ["SpeculativeConfig", "DraftBatch", "ProposeBatch", "Proposer", "ProposerNeeds", "register",
           "registered_methods"]
