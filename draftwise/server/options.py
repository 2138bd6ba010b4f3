"""The server's own options (what protects it from its clients), and their ``draftwise serve`` flags.

Engine flags (model, KV cache, per-request caps such as ``--max-n`` and
``--max-logprobs``) are in ``cli.py``; these bound what one client can make
the HTTP front end do:

- ``--max-request-body-bytes`` (default 4 MiB): a larger body gets 413, and
  is never read whole;
- ``--header-read-timeout`` / ``--body-read-timeout`` (s): a connection that
  has not sent complete headers, or a request whose body has not arrived,
  within them is closed (408 for the body), so half-sent requests cannot pile up;
- ``--send-timeout`` (s): a response a client does not read for this long is
  aborted (its engine request too), so a stalled reader holds nothing for long;
- ``--trust-request-chat-template``: allow vLLM's per-request ``chat_template``
  (off: 400), rendered in ``TemplateSandbox`` with ``--chat-template-timeout``;
- ``--max-prompts`` (default 2048, OpenAI's limit): prompts in one completions request (each is
  checked as a request of its own; ``--max-n`` bounds ``n``);
- ``--disable-fastapi-docs``: no ``/docs``, ``/redoc``, ``/openapi.json``
  (with ``--api-key`` they require the key anyway).

``per_request_spec_decode_metrics`` (``none``, ``summary``, ``detailed``) is
read from vLLM's engine flag ``--per-request-spec-decode-metrics`` (defined
with the engine flags): the server puts ``metrics.speculative_decoding`` in
its responses (``spec_metrics.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from ..compat.vllm.arg_rules import log_noops, resolve_vllm_args
from ..compat.vllm.engine_args import VLLM_FRONTEND_ARGS
from ..compat.vllm.engine_flags import add_vllm_flags, parse_json_flags

SPEC_METRICS_LEVELS = ("none", "summary", "detailed")


@dataclass(frozen=True)
class ServerOptions:
    api_key: str | None = None
    max_request_body_bytes: int = 4 << 20
    header_read_timeout: float = 10.0
    body_read_timeout: float = 30.0
    send_timeout: float = 60.0
    trust_request_chat_template: bool = False
    chat_template_timeout: float = 2.0
    disable_fastapi_docs: bool = False
    per_request_spec_decode_metrics: str = "none"
    max_prompts: int = 2048  # prompts in one completions request (OpenAI's limit)

    def __post_init__(self) -> None:
        if self.per_request_spec_decode_metrics not in SPEC_METRICS_LEVELS:
            raise ValueError(f"--per-request-spec-decode-metrics={self.per_request_spec_decode_metrics!r} is "
                             f"invalid: must be one of {list(SPEC_METRICS_LEVELS)}")
        if not isinstance(self.max_prompts, int) or self.max_prompts < 1:
            raise ValueError(f"--max-prompts={self.max_prompts!r} must be an int >= 1")
        if not isinstance(self.max_request_body_bytes, int) or self.max_request_body_bytes < 1024:
            raise ValueError(f"--max-request-body-bytes={self.max_request_body_bytes!r} must be an int >= 1024")
        for name in ("header_read_timeout", "body_read_timeout", "send_timeout", "chat_template_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"--{name.replace('_', '-')}={value!r} must be a number of seconds > 0")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ServerOptions":
        return cls(api_key=args.api_key, max_request_body_bytes=args.max_request_body_bytes,
                   header_read_timeout=args.header_read_timeout, body_read_timeout=args.body_read_timeout,
                   send_timeout=args.send_timeout, trust_request_chat_template=args.trust_request_chat_template,
                   chat_template_timeout=args.chat_template_timeout, disable_fastapi_docs=args.disable_fastapi_docs,
                   per_request_spec_decode_metrics=getattr(args, "per_request_spec_decode_metrics", None) or "none",
                   max_prompts=args.max_prompts)


def add_server_args(parser: argparse.ArgumentParser) -> None:
    default = ServerOptions()
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes "
                        "(and on the API docs)")
    parser.add_argument("--max-request-body-bytes", type=int, default=default.max_request_body_bytes,
                        help="larger request bodies get 413 (default: 4 MiB)")
    parser.add_argument("--header-read-timeout", type=float, default=default.header_read_timeout,
                        help="seconds a connection may take to send a request's headers")
    parser.add_argument("--body-read-timeout", type=float, default=default.body_read_timeout,
                        help="seconds a request may take to send its body (408 after)")
    parser.add_argument("--send-timeout", type=float, default=default.send_timeout,
                        help="seconds a client may leave a response unread before it is aborted")
    parser.add_argument("--trust-request-chat-template", action="store_true",
                        help="allow a per-request chat_template (rendered in a sandboxed process)")
    parser.add_argument("--chat-template-timeout", type=float, default=default.chat_template_timeout,
                        help="seconds a request's chat_template may take to render")
    parser.add_argument("--max-prompts", type=int, default=default.max_prompts,
                        help="prompts in one /v1/completions request (default: OpenAI's 2048)")
    parser.add_argument("--disable-fastapi-docs", action="store_true",
                        help="serve no /docs, /redoc or /openapi.json")


def vllm_server_flag_names() -> list[str]:
    """vLLM's server flags that are not ours (``add_server_args`` adds them; ``check_vllm_server_flags``)."""
    ours = {f.name for f in dataclasses.fields(ServerOptions)} | {"host", "port"}
    return [name for name in VLLM_FRONTEND_ARGS if name not in ours]


def add_vllm_server_flags(parser: argparse.ArgumentParser) -> None:
    add_vllm_flags(parser, vllm_server_flag_names(), frontend=True)


def check_vllm_server_flags(args: argparse.Namespace) -> None:
    """Refuse (``ValueError`` naming the flag and why) vLLM server flags that cannot work here; log
    the no-ops."""
    values = parse_json_flags({name: getattr(args, name) for name in vllm_server_flag_names()})
    log_noops(resolve_vllm_args(values, frontend=True))
