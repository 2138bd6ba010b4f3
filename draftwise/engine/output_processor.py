"""Applies sampled tokens to sequences: stop conditions, detokenization, outputs.

Stop rules, checked after each appended token, in vLLM's order: EOS (unless
``ignore_eos``), ``stop_token_ids``, stop strings (the text is cut before the
match unless ``include_stop_str_in_output``), ``max_tokens``, and the model's
context length. None of them fires before ``min_tokens`` tokens. (A completed grammar also
finishes a sequence with ``"stop"``, on its last token: ``structured_outputs.py``.)

Logprob dicts (a sampled token's, a scored prompt token's) hold the token
itself first, with its rank, then the top-N tokens ranked 1..N; each entry's
``decoded_token`` is that single token decoded.
"""
from __future__ import annotations

import time

from ..outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from ..sequence import Sequence
from .model_runner import StepResult
from .prompt_logprobs import PromptLogprobs


class OutputProcessor:
    def __init__(self, tokenizer, eos_token_ids: set[int], max_model_len: int):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self._token_texts: dict[int, str] = {}  # token id -> decoded alone (at most the vocabulary)

    def append(self, result: StepResult) -> list[Sequence]:
        """Append each emitted token in order; return the sequences that finished.

        A step may emit several tokens per sequence (accepted drafts, then one
        sampled token); tokens after a stop condition are dropped.
        """
        now = time.time()
        finished = []
        for i, seq in enumerate(result.seqs):
            if seq.first_token_time is None:
                seq.first_token_time = now
            for j, token in enumerate(result.token_ids[i]):
                seq.all_token_ids.append(token)
                if result.logprobs is not None and seq.logprobs is not None:
                    self._record_logprobs(seq, result, i, j)
                if self._check_stop(seq, token):
                    seq.finished_time = now
                    finished.append(seq)
                    break
        return finished

    def _record_logprobs(self, seq: Sequence, result: StepResult, i: int, j: int) -> None:
        token, logprob = result.token_ids[i][j], result.logprobs[i][j]
        num_top = seq.params.logprobs
        top_ids = top_lps = ()
        if num_top and result.top_ids is not None:
            top_ids, top_lps = result.top_ids[i][j][:num_top], result.top_logprobs[i][j][:num_top]
        seq.logprobs.append(self._logprob_entry(token, logprob, result.ranks[i][j], top_ids, top_lps))
        seq.cumulative_logprob += logprob

    def record_prompt_logprobs(self, prompt_logprobs: list, scored: PromptLogprobs) -> None:
        """Write one step's scored prompt tokens into a request's ``prompt_logprobs`` (entry ``p`` is
        prompt token ``p``'s dict); a prompt scored again after preemption replaces what follows."""
        fig = scored.figures
        entries = [self._logprob_entry(*row) for row in zip(scored.token_ids, fig.logprobs, fig.ranks,
                                                              fig.top_ids, fig.top_logprobs)]
        prompt_logprobs[scored.first:] = entries

    def _logprob_entry(self, token: int, logprob: float, rank: int, top_ids, top_logprobs) -> dict[int, Logprob]:
        """``{token: Logprob(logprob, rank)}``, then the top tokens ranked 1, 2, ...; tokens decoded."""
        entry = {token: Logprob(logprob, rank, self._token_text(token))}
        for top_rank, (tid, lp) in enumerate(zip(top_ids, top_logprobs), start=1):
            if tid not in entry:
                entry[tid] = Logprob(lp, top_rank, self._token_text(tid))
        return entry

    def _token_text(self, token: int) -> str:
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.tokenizer.decode([token])
        return text

    def _check_stop(self, seq: Sequence, token: int) -> bool:
        params = seq.params
        if seq.num_output_tokens >= params.min_tokens:
            if token in self.eos_token_ids and not params.ignore_eos:
                seq.finish_reason = "stop"
                return True
            if token in params.stop_token_ids:
                seq.finish_reason, seq.stop_reason = "stop", token
                return True
            if params.stop_strings and self._match_stop_string(seq):
                return True
        if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
            seq.finish_reason = "length"
            return True
        if seq.num_tokens >= self.max_model_len:
            seq.finish_reason = "length"
            return True
        return False

    def _match_stop_string(self, seq: Sequence) -> bool:
        text = self.decode(seq)
        longest = max(len(s) for s in seq.params.stop_strings)
        search_from = max(0, len(seq.text) - longest)
        seq.text = text
        hits = [(text.find(s, search_from), s) for s in seq.params.stop_strings]
        hits = [(pos, s) for pos, s in hits if pos >= 0]
        if not hits:
            return False
        pos, stop = min(hits)
        seq.text = text[:pos + len(stop)] if seq.params.include_stop_str_in_output else text[:pos]
        seq.finish_reason, seq.stop_reason = "stop", stop
        return True

    def decode(self, seq: Sequence) -> str:
        tokens = seq.output_token_ids
        stopped_by_token = (seq.finish_reason == "stop" and not isinstance(seq.stop_reason, str) and bool(tokens)
                            and (tokens[-1] == seq.stop_reason or tokens[-1] in self.eos_token_ids))
        if stopped_by_token and not seq.params.include_stop_str_in_output:
            tokens = tokens[:-1]  # the EOS / stop token is not part of the text
        return self.tokenizer.decode(tokens, skip_special_tokens=seq.params.skip_special_tokens)

    def make_output(self, request_id: str, prompt: str | None, seqs: list[Sequence],
                    with_partial_text: bool = False) -> RequestOutput:
        completions = []
        for seq in seqs:
            # A matched stop string already cut the text; unfinished text is only decoded when
            # asked (streaming), so plain generate() decodes each sequence once.
            if not isinstance(seq.stop_reason, str) and (seq.is_finished or with_partial_text):
                seq.text = self.decode(seq)
            logprobs_on = seq.params.logprobs is not None
            completions.append(CompletionOutput(
                index=seq.index, text=seq.text, token_ids=list(seq.output_token_ids),
                cumulative_logprob=seq.cumulative_logprob if logprobs_on else None,
                logprobs=seq.logprobs, finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
        first = seqs[0]
        return RequestOutput(request_id=request_id, prompt=prompt, prompt_token_ids=first.prompt_token_ids,
                             outputs=completions, finished=all(s.is_finished for s in seqs),
                             metrics=request_metrics(seqs), kv_transfer_params=first.kv_transfer_params,
                             num_cached_tokens=first.num_cached_tokens)


def request_metrics(seqs: list[Sequence]) -> RequestMetrics:
    first = seqs[0]
    return RequestMetrics(
        arrival_time=first.arrival_time, first_scheduled_time=first.first_scheduled_time,
        first_token_time=min((s.first_token_time for s in seqs if s.first_token_time), default=None),
        finished_time=max((s.finished_time or 0 for s in seqs), default=None) or None,
        num_generation_tokens=sum(s.num_output_tokens for s in seqs),
        num_preemptions=sum(s.num_preemptions for s in seqs),
        spec_num_drafts=sum(s.spec.num_drafts for s in seqs),
        spec_num_draft_tokens=sum(s.spec.num_draft_tokens for s in seqs),
        spec_num_accepted_tokens=sum(s.spec.num_accepted_tokens for s in seqs))


def error_output(request_id: str, prompt: str | None, seqs: list[Sequence]) -> RequestOutput:
    """The output of a request whose own output could not be built: no text, ``finish_reason="error"``."""
    completions = [CompletionOutput(index=seq.index, text="", token_ids=[], finish_reason="error") for seq in seqs]
    return RequestOutput(request_id=request_id, prompt=prompt, prompt_token_ids=seqs[0].prompt_token_ids,
                         outputs=completions, finished=True, metrics=request_metrics(seqs))
