"""Tensor parallelism: process groups, the shard layout of a model, and the executors that run its ranks."""
