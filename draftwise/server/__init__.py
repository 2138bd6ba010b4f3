"""The OpenAI-compatible HTTP server behind ``draftwise serve``.

``async_engine`` runs one ``LLMEngine`` loop on its own thread for every
connection (``data_parallel`` instead runs ``--data-parallel-size`` replicas,
each a ``replica`` process, placed by ``compat.vllm.data_parallel_flags``);
``protocol`` holds the request/response models and OpenAI's error format
(``compat.vllm.request_fields``: the fields accepted without being implemented,
at their neutral value only); ``serving_completions`` / ``serving_chat`` turn
requests into engine requests and engine outputs into responses or SSE
chunks, ``serving_tokenize`` serves vLLM's ``/tokenize`` and ``/detokenize``;
``spec_metrics`` builds vLLM's per-request speculative figures; ``metrics``
is the Prometheus registry and the periodic log line; ``app`` wires the routes.
What one client may cost the others is bounded by ``options`` (the flags),
``guards`` (body size, header/body/send timeouts), ``preprocess``
(tokenization and chat templates off the event loop) and ``template_sandbox``
(request-supplied chat templates in a bounded worker process).
"""
