"""vLLM's metrics: recorded by the engine (``recorder.StatsRecorder``), returned by
``LLM.get_metrics()`` as ``reader`` objects, served on ``GET /metrics`` (``prometheus``) and
logged every interval (``stat_logger``). Names, types and labels are vLLM's (``vllm:*``)."""
