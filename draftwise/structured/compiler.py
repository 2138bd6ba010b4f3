"""``GrammarCompiler``: grammar texts compiled into matchers once, off the step loop, and cached.

``lookup(text)`` returns the compiled matcher of a grammar compiled before (a cache hit), or
None. ``submit(text)`` compiles it on the compiler's one worker thread and returns a
``Future`` of the matcher; a grammar already being compiled is not compiled twice. The cache is
an LRU of ``capacity`` grammars keyed by the grammar text (``grammar.py`` makes it canonical).
Cached matchers are templates in their initial state: a sequence works on a ``deep_copy``.

The llguidance tokenizer is built by ``make_tokenizer`` on the worker thread at the first
compile (a fraction of a second for a large vocabulary), so neither start-up nor a step pays for it. A grammar
that fails to compile (it validated without a tokenizer but does not build with this one)
makes its future raise ``ValueError``.

``num_compiled`` and ``num_hits`` count compiles and cache hits (``lookup`` hits and submits
answered from the cache or from a compile in flight).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance

DEFAULT_CAPACITY = 128


class GrammarCompiler:
    def __init__(self, make_tokenizer: Callable[[], llguidance.LLTokenizer], capacity: int = DEFAULT_CAPACITY):
        self._make_tokenizer = make_tokenizer
        self._tokenizer: llguidance.LLTokenizer | None = None
        self.capacity = capacity
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._in_flight: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._worker: ThreadPoolExecutor | None = None  # started at the first submit
        self.num_compiled = 0
        self.num_hits = 0

    def knows(self, text: str) -> bool:
        """``text`` is compiled or being compiled (so it was validated before)."""
        with self._lock:
            return text in self._cache or text in self._in_flight

    def lookup(self, text: str) -> llguidance.LLMatcher | None:
        with self._lock:
            matcher = self._cache.get(text)
            if matcher is not None:
                self._cache.move_to_end(text)
                self.num_hits += 1
            return matcher

    def submit(self, text: str) -> Future:
        """A future of ``text``'s compiled matcher (a template: copy it before use)."""
        with self._lock:
            cached = self._cache.get(text)
            if cached is not None or text in self._in_flight:
                self.num_hits += 1
                if cached is not None:
                    self._cache.move_to_end(text)
                    done: Future = Future()
                    done.set_result(cached)
                    return done
                return self._in_flight[text]
            if self._worker is None:
                self._worker = ThreadPoolExecutor(1, "draftwise-grammar")
            future = self._worker.submit(self._compile_and_cache, text)
            self._in_flight[text] = future
            return future

    def _compile_and_cache(self, text: str) -> llguidance.LLMatcher:
        try:
            matcher = self.compile(text)
        except BaseException:
            with self._lock:
                self._in_flight.pop(text, None)
            raise
        with self._lock:  # leaves in-flight and enters the cache at once: no second compile
            self._in_flight.pop(text, None)
            self._cache[text] = matcher
            self._cache.move_to_end(text)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return matcher

    def compile(self, text: str) -> llguidance.LLMatcher:
        """Build the matcher of ``text`` (on the worker thread; llguidance releases the GIL)."""
        if self._tokenizer is None:
            self._tokenizer = self._make_tokenizer()
        matcher = llguidance.LLMatcher(self._tokenizer, text, log_level=0)
        with self._lock:
            self.num_compiled += 1
        if matcher.is_error():
            raise ValueError(f"the grammar does not compile: {matcher.get_error()}")
        return matcher
