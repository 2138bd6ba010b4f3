"""LLMEngine: requests in, ``RequestOutput``s out, one ``step()`` at a time.

``add_request`` validates and tokenizes a prompt and queues its ``n``
sequences; a bad request raises ``ValueError`` before touching any state, so
the requests already in flight are unaffected. ``step`` schedules a batch,
runs it, applies the sampled tokens and returns the outputs of the requests
that progressed (finished ones are released from the cache at once).
``abort_request`` frees a request's blocks immediately. If a step raises, the
requests that cause it are found by bisection (``fault_isolation.py``) and fail
alone (``finish_reason="error"``, ``RequestOutput.error`` says why); the others'
step runs without them, with the tokens a batch without them would give. A fault in one
request's drafting (the proposer's or the grammar's) or in building its output (detokenization)
ends that request alone the same way; a grammar that refuses an emitted token fails its request
with its output cut.

``async_scheduling=True`` builds the previous step's outputs on a worker thread
while each forward runs (see ``step``).

With ``speculative_config``, a ``Speculator`` drafts tokens after each step;
the next step verifies them in the same target forward that decodes, and
``BlockManager.rollback`` keeps the accepted positions' K/V and drops the rest.
Structured outputs (grammars compiled off the step loop, masks, grammar drafts with or without
a ``Speculator``): ``structured_outputs.py``.

Every step's forward is timed into ``StepCostModel``s (seeded at start-up), by
its rows and the keys its decode rows read: the one of steps without prefill
prices drafts for the draft-length policy, the
one of every step (``decode_stall_factor``) bounds the prefill that joins a
step while sequences decode.

Every KV tensor (the target's and a drafter's) comes from one ``KVPool``,
sized together for ``kv_cache_memory_bytes``.

``self.stats`` records every step's outputs, every abort and the engine's state
(vLLM's metrics: ``get_metrics()``, the server's ``/metrics``, the periodic log
lines; see ``metrics/recorder.py``).
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import random
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..config import EngineConfig
from ..distributed.setup import start_tensor_parallel
from ..distributed.sharded_model import SharedTarget, ShardedPagedModel
from ..errors import EngineDeadError
from ..metrics.reader import Metric
from ..metrics.recorder import StatsRecorder
from ..models.generation_config import sampling_defaults
from ..models.loader import SMOLLM2_NAME, gguf_file, resolve_model
from ..models.registry import build_model, load_blocks_ahead, load_config, load_tokenizer
from ..models.shard_layout import check_divisible
from ..outputs import RequestOutput
from ..paged import KVPool, PagedModel
from ..sampling_params import SamplingParams
from ..sequence import Sequence
from ..spec_decode.interface import ProposerNeeds, TargetInfo
from .compile_target import capture_target, compile_target, why_not_compiled
from .drafting.speculator import Speculator
from .drafting.step_cost import StepCostModel, fixed_row_cost
from .drafting.step_timing import (FURTHER_ROWS, KEY_CONTEXTS, measure_further_key_seconds, measure_key_seconds,
                                   measure_step_seconds)
from .fault_isolation import find_failing
from .gc_pause import paused_gc
from .model_runner import ModelRunner, StepResult
from .output_processor import OutputProcessor, error_output
from .model_limits import default_max_num_batched_tokens, eos_token_ids, resolve_max_model_len
from .prompt_input import tokenize_prompt
from .request_checks import check_request
from .scheduler import Scheduler, SchedulerOutput
from .structured_outputs import GrammarRefusal, StructuredOutputs

logger = logging.getLogger("draftwise")


@dataclass
class _Request:
    prompt: str | None
    seqs: list[Sequence]
    error: str | None = None  # why the engine failed this request (its step raised because of it)
    prompt_logprobs: list | None = None  # [None, {token: Logprob}, ...] when the request asks (prompt_logprobs.py)


class LLMEngine:
    @paused_gc()  # start-up makes long-lived objects by the hundred thousand (gc_pause.py)
    def __init__(self, config: EngineConfig):
        self.config = config
        extra = config.additional_config or {}
        self.gguf_weights = extra.get("gguf_weights", config.default_gguf_weights)
        blocks = load_blocks_ahead(gguf_file(config.model), device=config.torch_device,  # while the folder,
                                   world_size=config.tensor_parallel_size, gguf_weights=self.gguf_weights,
                                   quantization=config.quantization)  # config and tokenizer load
        path = resolve_model(config.model)
        config.model_path = path
        self.hf_config = load_config(path)
        check_divisible(self.hf_config, config.tensor_parallel_size)  # before anything else is resolved
        self.tokenizer = load_tokenizer(config.tokenizer or path)
        self.max_model_len = resolve_max_model_len(config, self.hf_config)
        self.device, self.dtype = config.torch_device, config.torch_dtype
        self.executor = start_tensor_parallel(config, self.max_model_len)  # None: one rank
        if self.executor is not None:
            weakref.finalize(self, self.executor.shutdown)
        model = build_model(path, self.hf_config, self.dtype, self.device, self.max_model_len,
                            tp=self.executor and self.executor.group,
                            gguf_weights=self.gguf_weights, quantization=config.quantization, blocks=blocks)
        self.eos_token_ids = eos_token_ids(self.hf_config, self.tokenizer)
        self.sampling_defaults = sampling_defaults(config.generation_config, path, config.override_generation_config)
        self.speculator = self._make_speculator(model) if config.speculative else None
        shared_host = self.executor is not None and self.device.type == "cpu" and self.executor.local
        pool = KVPool(config.block_size, self.dtype, self.device, config.tensor_parallel_size if shared_host else 1)
        pool.add("target", PagedModel.kv_cache_spec(model))
        if self.speculator:
            self.speculator.add_kv(pool)
        self.needs = self.speculator.needs if self.speculator else ProposerNeeds()  # what the step must produce
        self.prefix_caching = self._prefix_caching()
        self.block_manager = pool.allocate(config.kv_cache_memory_bytes, config.max_num_seqs, self.max_model_len,
                                           self.prefix_caching, self.needs.kv_cache,
                                           int(self.needs.kv_reads_next_token), config.gpu_memory_utilization)
        num_blocks = self.block_manager.num_blocks
        paged = self._paged_target(model, pool.tensor("target"))
        self.structured = StructuredOutputs(self.tokenizer, self.hf_config.vocab_size, self.eos_token_ids,
                                            self.max_model_len, self.speculator and self.speculator.num_spec_tokens,
                                            grammar_drafts=extra.get("grammar_drafts", True))
        self.runner = ModelRunner(paged, self.eos_token_ids, config.rejection_sampler.rule(), self.structured)
        max_batched = (config.max_num_batched_tokens
                       or default_max_num_batched_tokens(self.max_model_len, self.device.type))
        self.compile_seconds = 0.0
        compiles = config.compilation.resolved_mode(config.enforce_eager) != 0
        uncompiled = compiles and why_not_compiled(model, self.executor is not None)
        if uncompiled:
            logger.warning("draftwise: compilation_config mode > 0 is not applied: %s", uncompiled)
        elif compiles:
            self.compile_seconds = compile_target(paged, self.block_manager, config.compilation, max_batched,
                                                  self.needs.aux_layer_ids, self.device)
        if self.executor is None:  # CUDA graphs, on a GPU (paged.static_step)
            capture_target(paged, pool.spare_block, config.compilation, config.enforce_eager, config.max_num_seqs,
                           self.max_model_len)
        self.step_cost, self.decode_cost = self._step_cost_models(paged, max_batched)
        if self.speculator:
            self.speculator.bind(pool)
            self.speculator.price_with(self.decode_cost)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, max_batched, self.step_cost,
                                   config.decode_stall_factor)
        self.output_processor = OutputProcessor(self.tokenizer, self.eos_token_ids, self.max_model_len)
        self.requests: dict[str, _Request] = {}
        self._seed_rng = random.Random(config.seed)
        self.detokenize_unfinished = False  # streaming front-ends turn this on
        self._pending_outputs: list[str] = []  # async scheduling: requests the last step advanced
        self._output_thread = ThreadPoolExecutor(1, "draftwise-output") if config.async_scheduling else None
        self.stats = StatsRecorder.for_engine(self, SMOLLM2_NAME)  # vLLM's metrics and log lines (metrics/)
        self._log_start(model.num_gguf_linears, num_blocks)
        gc.collect()  # as vLLM does: the start-up heap (torch, tokenizer, model) lives as long as the
        gc.freeze()   # process, so full collections skip it (a ~0.2 s pause each, every stream stalled)

    def _paged_target(self, model, kv_cache) -> PagedModel:
        """The target bound to its KV cache; under tensor parallelism, the workers allocate theirs now
        (same number of blocks) and each call of the driver's runs on every rank (``distributed/``)."""
        if self.executor is None:
            return PagedModel(model, kv_cache, self.config.block_size, self.device, self.block_manager.block_table)
        self.executor.send(("kv", self.block_manager.num_blocks))
        return ShardedPagedModel(model, kv_cache, self.config.block_size, self.device,
                                 self.block_manager.block_table, self.executor)

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers, if any (also done when the engine is garbage collected)."""
        if self.executor is not None:
            self.executor.shutdown()

    def _log_start(self, num_gguf_linears: int, num_blocks: int) -> None:
        config = self.config
        on_blocks = f", {num_gguf_linears} linears on GGUF blocks" if num_gguf_linears else ""
        logger.info("draftwise: %s on %s (%s%s), max_model_len=%d, KV cache %d blocks x %d tokens",
                    config.model_path.name, self.device, self.dtype, on_blocks,
                    self.max_model_len, num_blocks, config.block_size)
        logger.info("draftwise: step time by rows at start-up: %s", self.step_cost.describe())
        if config.speculative:
            logger.info("draftwise: speculative decoding %s", config.speculative.to_dict())

    @classmethod
    def from_engine_args(cls, engine_args) -> "LLMEngine":
        """vLLM's constructor: an engine from ``EngineArgs`` (``engine/arg_utils.py``)."""
        return cls(engine_args.create_engine_config())

    def _step_cost_models(self, paged: PagedModel, max_num_tokens: int) -> tuple[StepCostModel, StepCostModel]:
        """Two step-cost models seeded with the same timed forwards: one learns from every step (it
        bounds prefill), one only from steps without prefill (it prices drafts: a decode or verify
        row of a long context costs more than a prefill row, so prefill steps would under-price
        them). ``DRAFTWISE_VERIFY_ROW_COST`` fixes both instead (see ``drafting/step_cost.py``)."""
        row_cost = fixed_row_cost()
        if row_cost is not None:
            return StepCostModel.fixed(row_cost, max_num_tokens), StepCostModel.fixed(row_cost, max_num_tokens)
        models = StepCostModel(max_num_tokens), StepCostModel(max_num_tokens)
        if self._prices_drafts or self._bounds_prefill:  # their only readers: otherwise nothing is timed
            context_len = min(128, self.max_model_len // 2)
            k = self.speculator.num_spec_tokens if self.speculator else 1
            limit = min(max_num_tokens, self.max_model_len - context_len)
            samples = measure_step_seconds(paged, self.block_manager, [r for r in (1, 2, k + 1, 16, 64, 256)
                                                                       if r <= limit], context_len)
            contexts = (context_len, min(KEY_CONTEXTS[1], self.max_model_len - FURTHER_ROWS))
            key_seconds = measure_key_seconds(paged, self.block_manager, contexts=contexts)
            further = measure_further_key_seconds(paged, self.block_manager, contexts=contexts) \
                if self._prices_drafts else None  # (only drafts put several rows of a sequence in a step)
            for model in models:
                model.seed(samples, key_seconds, further)
        return models

    @property
    def _prices_drafts(self) -> bool:
        return self.speculator is not None

    @property
    def _bounds_prefill(self) -> bool:
        return self.config.decode_stall_factor is not None

    def _prefix_caching(self) -> bool:
        """``enable_prefix_caching`` resolved: on by default, off where a step must compute every
        prompt position (a KV producer, a proposer that is not ``prefix_cacheable``). A drafter's
        own KV lives in the same blocks and is shared along with the target's (``BlockManager``)."""
        asked = self.config.enable_prefix_caching
        reason = None
        if self.config.kv_transfer is not None:
            reason = "a KV transfer producer computes every prompt position"
        elif not self.needs.prefix_cacheable:
            reason = (f"the {self.config.speculative.method} proposer needs the target's states at every "
                      "prompt position, or keeps state outside its KV blocks")
        if reason and asked:
            logger.warning("draftwise: prefix caching is off: %s", reason)
        elif reason is None and asked is not False:
            logger.info("draftwise: prefix caching on")
        return reason is None and asked is not False

    def _make_speculator(self, model) -> Speculator:
        if self.executor is not None:  # the embedding and lm_head a drafter shares run on every rank
            model = SharedTarget(model, self.executor)
        target = TargetInfo(model=model, hf_config=self.hf_config, tokenizer=self.tokenizer, device=self.device,
                            dtype=self.dtype, vocab_size=self.hf_config.vocab_size,
                            max_model_len=self.max_model_len, block_size=self.config.block_size,
                            tensor_parallel_size=self.config.tensor_parallel_size,
                            model_path=self.config.model_path, kv_transfer=self.config.kv_transfer,
                            executor=self.executor, gguf_weights=self.gguf_weights)
        return Speculator(self.config.speculative, target)

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt, params: SamplingParams | None = None,
                    arrival_time: float | None = None) -> None:
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in the engine")
        text, token_ids = tokenize_prompt(self.tokenizer, prompt)
        if self.config.kv_transfer and self.config.kv_transfer.prefill_only:
            params = dataclasses.replace(params, max_tokens=1, min_tokens=0)  # a producer only prefills
        check_request(token_ids, params, self.hf_config.vocab_size, self.max_model_len,
                      self.block_manager.num_blocks * self.block_manager.block_size, self.config.request_limits,
                      self.speculator.num_spec_tokens if self.speculator else 0)
        grammar = self.structured.check(params)
        arrival = arrival_time or time.time()
        seqs = []
        for i in range(params.n):
            seed = params.seed + i if params.seed is not None else self._seed_rng.getrandbits(63)
            seqs.append(Sequence(request_id, i, token_ids, params, seed, arrival))
        scored = None if params.prompt_logprobs is None else [None]  # the first prompt token has no logprob
        self.requests[request_id] = _Request(text, seqs, prompt_logprobs=scored)
        for seq in self.structured.hold(seqs, grammar):  # constrained ones wait for their grammar
            self.scheduler.add(seq)

    def abort_request(self, request_id: str | list[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else request_id
        aborted = [rid for rid in dict.fromkeys(ids) if rid in self.requests]
        for rid in ids:
            request = self.requests.pop(rid, None)
            for seq in request.seqs if request else []:
                if not seq.is_finished:
                    seq.finish_reason = "abort"
                    self._release(seq)
        self.stats.record_abort(self, aborted)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ------------------------------------------------------------------ stepping
    def step(self) -> list[RequestOutput]:
        """Run one step (``_step``) and record its outputs in ``self.stats``."""
        outputs = self._step()
        self.stats.record_step(self, outputs)
        return outputs

    def _step(self) -> list[RequestOutput]:
        """Run one step; return the outputs of the requests it advanced.

        With ``async_scheduling`` the output thread builds the previous step's outputs
        (detokenization included) while this thread runs the step's forward, so each step returns
        the outputs of the step before it; the tokens, and so the outputs, are the same either way.
        (The forward stays on this thread: a second thread running torch ops would start a second
        OpenMP team, and on a small CPU both teams then stop spin-waiting and every op slows down.)"""
        refused = self._admit_compiled()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            self.structured.wait_for_compile(0.05)  # nothing else to run: do not spin
        if not self.config.async_scheduling:
            if plan.is_empty:
                return self._outputs(refused)
            plan, result, failed = self._execute_isolating(plan)
            return self._outputs(self._apply(plan, result) + failed + refused)
        previous = self._output_thread.submit(self._outputs, self._pending_outputs)
        plan, result, failed = (plan, None, []) if plan.is_empty else self._execute_isolating(plan, previous.result)
        outputs = previous.result()  # before _apply changes the sequences it reads
        self._pending_outputs = (self._apply(plan, result) if result is not None else []) + failed + refused
        return outputs

    def _admit_compiled(self) -> list[str]:
        """Schedule the sequences whose grammar compiled since the last step; fail the requests whose
        grammar did not build (their ids)."""
        ready, refused = self.structured.admit()
        for seq in ready:
            self.scheduler.add(seq)
        for request_id, error in refused:
            self._fail_request(request_id, error)
        return [request_id for request_id, _ in refused]

    def _execute_isolating(self, plan: SchedulerOutput, settle=lambda: None
                           ) -> tuple[SchedulerOutput, StepResult, list[str]]:
        """Execute the plan; if it raises, find the requests that make it raise (``fault_isolation``),
        fail only those, and execute the rest: returns the plan that ran, its result and the failed
        requests' ids. ``settle`` is called before any sequence changes (the output thread's turn)."""
        try:
            return plan, self._execute(plan), []
        except EngineDeadError:  # no request causes it: nothing to isolate
            raise
        except Exception as exc:
            logger.exception("draftwise: a step of %d requests failed; finding the request(s) that cause it",
                             len({item.seq.request_id for item in plan.scheduled}))
            error = exc
        settle()
        groups: dict[str, list] = {}
        for item in plan.scheduled:
            groups.setdefault(item.seq.request_id, []).append(item)
        failing = find_failing(list(groups.values()), lambda items: self.runner.execute(items, self.needs), error)
        request_ids = list(groups)
        failed = [request_ids[i] for i in failing]
        for request_id, exc in zip(failed, failing.values()):
            self._fail_request(request_id, exc)
        kept = [item for item in plan.scheduled if item.seq.request_id not in failed]
        plan = dataclasses.replace(plan, scheduled=kept)
        result = self._execute(plan) if kept else StepResult([], [], [])
        return plan, result, failed

    def _fail_request(self, request_id: str, error: Exception) -> None:
        """End a request the engine cannot run: its sequences finish with ``finish_reason="error"``
        and its output carries ``error``; its blocks are freed now."""
        logger.error("draftwise: request %s failed and was removed from the batch: %s: %s",
                     request_id, type(error).__name__, error)
        request = self.requests[request_id]
        request.error = f"{type(error).__name__}: {error}"
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish_reason = "error"
                self._release(seq)

    def _execute(self, plan: SchedulerOutput) -> StepResult:
        """Run the planned step on the target, timing it into the step-cost models in use."""
        start = time.perf_counter()
        result = self.runner.execute(plan.scheduled, self.needs)
        seconds = time.perf_counter() - start
        num_rows, num_keys = plan.num_batched_tokens, plan.decode_keys(self.decode_cost.further_key_share)
        if self._bounds_prefill:
            if plan.mixes_prefill:
                self.scheduler.observe_mixed_step(num_rows, seconds, num_keys)
            self.step_cost.observe(num_rows, seconds, num_keys)
        if self._prices_drafts and all(item.decodes for item in plan.scheduled):
            self.decode_cost.observe(num_rows, seconds, num_keys)  # a step without prefill
        return result

    def _apply(self, plan: SchedulerOutput, result: StepResult) -> list[str]:
        """Apply a step's tokens: cache, stop conditions, next drafts, releases. Returns the ids of
        the requests it advanced (everything the next schedule depends on happens here)."""
        for item in plan.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
        for seq, num_accepted in zip(result.seqs, result.num_accepted):
            seq.spec.roll_back(self.block_manager.rollback(seq, num_accepted))
            seq.spec.clear_drafts()  # verified: the next drafts come below
        spec = self.speculator
        if spec:
            spec.on_verified(result)
            for seq in plan.preempted:
                spec.on_finished(seq)
        finished = self.output_processor.append(result)
        completed, refused = self.structured.on_appended(result)  # grammars completed: finish_reason "stop"
        finished += completed
        for scored in result.prompt_logprobs:
            request = self.requests.get(scored.request_id)
            if request is not None:
                self.output_processor.record_prompt_logprobs(request.prompt_logprobs, scored)
        if spec:  # before finished sequences are released: their last rows still count
            for request_id, exc in dict((seq.request_id, exc) for seq, exc in spec.propose(result)).items():
                self._fail_request(request_id, exc)  # (its drafting raised: that request alone ends)
        for item in plan.scheduled:  # their full computed blocks become shareable (after the drafter ran)
            self.block_manager.cache_computed(item.seq)
        for seq, exc in self.structured.draft(result.seqs):  # the grammar's drafts, with or without a proposer
            self._fail_request(seq.request_id, exc)  # (its drafting raised: that request alone ends)
        for seq in finished:
            self._release(seq)
        for refusal in refused:
            self._refuse(refusal)
        return list(dict.fromkeys(s.request_id for s in result.seqs))

    def _refuse(self, refusal: GrammarRefusal) -> None:
        """A token its grammar refused: the output ends before it and the request fails."""
        if refusal.seq.request_id in self.requests:  # (releases its sequences still running)
            self._fail_request(refusal.seq.request_id, refusal.error())
        refusal.seq.finish_reason = "error"  # (one a stop rule had finished keeps no other reason)
        refusal.seq.truncate_output(refusal.num_valid)

    def _outputs(self, request_ids: list[str]) -> list[RequestOutput]:
        """The ``RequestOutput`` of each request (aborted ones skipped); finished ones leave the engine."""
        outputs = []
        for rid in request_ids:
            request = self.requests.get(rid)
            if request is None:
                continue
            try:
                out = self.output_processor.make_output(rid, request.prompt, request.seqs,
                                                        self.detokenize_unfinished)
            except Exception as exc:  # building this request's output (detokenizing it) failed: it alone ends
                self._fail_request(rid, exc)
                out = error_output(rid, request.prompt, request.seqs)
            out.error = request.error
            if request.prompt_logprobs is not None:
                out.prompt_logprobs = list(request.prompt_logprobs)
            if out.finished:
                del self.requests[rid]
            outputs.append(out)
        return outputs

    def get_metrics(self) -> list[Metric]:
        """vLLM's metrics since start-up, as ``vllm.v1.metrics.reader`` objects (``metrics/recorder.py``)."""
        return self.stats.snapshot()

    def get_spec_decode_stats(self) -> dict:
        """Speculative decoding counters since start-up and their derived rates (empty without speculation),
        why sequences drafted fewer than ``num_speculative_tokens`` (``spec_decode_draft_limits``, by the
        reasons of ``drafting/plan.py``), what drafts were priced with (``spec_decode_step_cost``: the
        step-cost model's predicted step time by rows, its key costs, and its mean predicted vs observed
        time of the decode steps it learnt from), and the grammar's drafts (``grammar_num_draft_tokens``,
        ``..._accepted_tokens``) once structured outputs ran."""
        spec = {}
        if self.speculator:
            spec = (self.speculator.stats.as_dict() | self.speculator.proposer.source_stats()
                    | self.speculator.draft_limits.as_dict() | self.decode_cost.as_stats())
        return {**spec, **self.structured.spec_stats()}

    # ------------------------------------------------------------------ helpers
    def _release(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        self.structured.release(seq)
        if self.speculator:
            self.speculator.on_finished(seq)
