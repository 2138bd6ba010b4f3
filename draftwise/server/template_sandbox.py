"""Request-supplied chat templates, rendered in a worker process with time, memory and output bounds.

A chat template is a Jinja program. One sent by a client (vLLM's
``chat_template`` request field, allowed only with
``--trust-request-chat-template``) may loop for minutes or build gigabytes,
and no thread can be stopped from outside. ``TemplateSandbox.render`` runs it
in a worker process, in the sandboxed Jinja environment transformers uses for
every chat template (``render_jinja_template``), and bounds:

- time: after ``timeout`` seconds the worker is killed (the next render
  starts a new one) and the request gets ``ValueError``;
- memory: the worker's address space is capped at what it held after
  start-up plus ``memory_bytes`` (``RLIMIT_AS``), so a template building a
  huge string fails with ``MemoryError`` in the worker, not in the server;
- output: a rendering longer than ``max_chars`` is refused.

Renders run one at a time (each bound applies to one template). ``render``
blocks: call it from a worker thread, never on the event loop.
"""
from __future__ import annotations

import multiprocessing
import os
import threading

DEFAULT_TIMEOUT = 2.0
DEFAULT_MEMORY_BYTES = 512 << 20
DEFAULT_MAX_CHARS = 4 << 20


class TemplateSandbox:
    def __init__(self, timeout: float = DEFAULT_TIMEOUT, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 max_chars: int = DEFAULT_MAX_CHARS):
        self.timeout, self.memory_bytes, self.max_chars = timeout, memory_bytes, max_chars
        self._context = multiprocessing.get_context("spawn")  # never fork a process running torch threads
        self._pool = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the worker now (about a second) rather than on the first render."""
        with self._lock:
            self._ensure_pool()

    def render(self, template: str, messages: list[dict], template_kwargs: dict) -> str:
        """The rendered prompt; ``ValueError`` if the template fails or passes a bound."""
        with self._lock:
            pool = self._ensure_pool()
            pending = pool.apply_async(_render, (template, messages, template_kwargs, self.max_chars))
            try:
                return pending.get(self.timeout)
            except multiprocessing.TimeoutError:
                self._kill()
                raise ValueError(f"chat_template took longer than {self.timeout:g} s to render") from None
            except MemoryError:
                self._kill()  # a worker that ran out of memory is not trusted with the next template
                raise ValueError(f"chat_template needed more than {self.memory_bytes >> 20} MiB to render") from None
            except Exception as exc:  # the template's own error (a Jinja error, raise_exception, ...)
                raise ValueError(f"cannot apply chat_template: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _ensure_pool(self):
        if self._pool is None:
            self._pool = self._context.Pool(1, initializer=_start_worker, initargs=(self.memory_bytes,))
            self._pool.apply(_ready)  # start-up (an interpreter and an import) is not the template's time
        return self._pool

    def _kill(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None


def _start_worker(memory_bytes: int) -> None:
    """Worker start-up: import the renderer, then cap the address space at what it holds now + the budget."""
    from transformers.utils import chat_template_utils  # noqa: F401 (imported before the cap)

    try:
        import resource

        with open(f"/proc/{os.getpid()}/statm") as statm:
            vm_bytes = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = vm_bytes + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, OSError, ValueError):
        pass  # no /proc or no RLIMIT_AS on this system: time and output bounds still hold


def _ready() -> bool:
    return True


def _render(template: str, messages: list[dict], template_kwargs: dict, max_chars: int) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[messages], chat_template=template, **template_kwargs)
    text = rendered[0]
    if len(text) > max_chars:
        raise ValueError(f"the rendered prompt has {len(text)} characters, more than {max_chars}")
    return text
