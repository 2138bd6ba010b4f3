"""vLLM's module paths that its examples import resolve with ``vllm`` swapped for ``draftwise``
(``compat/vllm/module_paths.py``), to draftwise's own modules."""
from __future__ import annotations

from conftest import greedy


def test_the_metrics_example_reads_every_kind(tiny_llm):
    from draftwise.v1.metrics.reader import Counter, Gauge, Histogram, Metric, Vector

    tiny_llm.generate("Hello", greedy(4), use_tqdm=False)
    metrics = tiny_llm.get_metrics()
    assert all(isinstance(m, Metric) for m in metrics)
    assert {Counter, Gauge, Histogram} <= {type(m) for m in metrics}
    generated = next(m for m in metrics if isinstance(m, Counter) and m.name == "vllm:generation_tokens")
    assert generated.value >= 4 and Vector.__module__ == "draftwise.metrics.reader"


def test_kv_transfer_config_path_is_draftwise_own_module():
    import draftwise.config.kv_transfer as kv_transfer
    from draftwise.config.kv_transfer import KVTransferConfig
    from draftwise.config import KVTransferConfig as own

    assert KVTransferConfig is own and kv_transfer.KVTransferConfig is own
