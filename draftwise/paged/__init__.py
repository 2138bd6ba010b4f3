"""Paged KV: the pool that owns every KV tensor, block ids and rollback, and the ragged forward."""
from .batch import ForwardInput, prepare_batch
from .block_manager import BlockManager
from .kv_pool import KVCacheSpec, KVPool
from .model import PagedModel

__all__ = ["BlockManager", "ForwardInput", "KVCacheSpec", "KVPool", "PagedModel", "prepare_batch"]
