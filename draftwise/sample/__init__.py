"""Sampling and verification: one step's logits in, each sequence's tokens out (see ``sampler.py``)."""
from .logprobs import HostLogprobs, TokenLogprobs, gather_logprobs, pack_logprobs, unpack_logprobs
from .metadata import Penalties, SamplingMetadata, build_sampling_metadata
from .sampler import HostSample, SamplerOutput, sample
from .spec_decode_metadata import PLACEHOLDER_TOKEN_ID, SpecDecodeMetadata
from .verify.config import RejectionSamplerConfig
from .verify.rules import STANDARD, VerifyRule

__all__ = ["PLACEHOLDER_TOKEN_ID", "STANDARD", "HostLogprobs", "HostSample", "Penalties", "RejectionSamplerConfig",
           "SamplerOutput", "SamplingMetadata", "SpecDecodeMetadata", "TokenLogprobs", "VerifyRule",
           "build_sampling_metadata", "gather_logprobs", "pack_logprobs", "sample", "unpack_logprobs"]
