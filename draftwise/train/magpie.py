"""``magpie``: the target writes the user turns of its own training conversations (no download).

Magpie's observation: an instruction-tuned model given its chat template up to the start of a
user turn writes a plausible user request. ``user_turn_prefix`` renders the conversation so far
plus an empty user turn through the tokenizer's own chat template and cuts it where the user's
text would begin, so this works for any template. Variety comes from the system prompt (a role
crossed with a length hint), from sampling, from follow-up turns written the same way after
the target's answer, and, for a share of turns (``opener_fraction``), from an opening word the
turn is started with (``OPENERS``: "Write", "Explain", "Fix", ...): left alone, a small model
writes most requests in a few forms ("Can you provide ...", "Can you help me ...").

``write_user_turns(llm, conversations, seed)`` returns one cleaned request per conversation, or
None where the model wrote nothing usable (empty, cut off at the length cap, a template token,
too short). ``Deduplicator`` drops requests already seen (case, spacing and punctuation ignored).
"""
from __future__ import annotations

import random
import re

from ..llm import LLM
from ..sampling_params import SamplingParams

ROLES = (
    "You are a helpful assistant.",
    "You are a friendly and knowledgeable assistant who explains things clearly.",
    "You are an expert Python programmer who helps people write and fix code.",
    "You are a patient teacher who answers students' questions.",
    "You are a creative writer who helps people with stories, poems and letters.",
    "You are a practical assistant for everyday tasks: cooking, travel, money and health.",
    "You are a science communicator who answers questions about nature, space and technology.",
    "You are a careful assistant who helps people plan, organise and make decisions.",
    "You are a helpful assistant for writing emails, summaries and professional documents.",
    "You are a math tutor who solves problems step by step.",
    "You are a history enthusiast who answers questions about the past.",
    "You are a helpful assistant that answers questions about software, computers and the web.",
)
OPENERS = ("Write", "Explain", "What", "How", "Why", "Give me", "List", "Compare", "Summarize", "Describe",
           "Create", "Help me", "I", "Is", "Translate", "Fix", "Suggest", "Tell me", "Which", "Plan", "Solve",
           "Rewrite", "My", "In", "Generate", "Should")
LENGTH_HINTS = ("", " Keep your answers short.", " Give detailed answers.", " Answer in a few sentences.")
MARK = "\u2063USER\u2063"  # a placeholder no real request contains
MIN_WORDS = 3


def system_prompts() -> list[str]:
    return [role + hint for role in ROLES for hint in LENGTH_HINTS]


def user_turn_prefix(tokenizer, messages: list[dict]) -> str:
    """The chat template's text of ``messages`` followed by an open user turn."""
    text = tokenizer.apply_chat_template([*messages, {"role": "user", "content": MARK}], tokenize=False,
                                         add_generation_prompt=False)
    if MARK not in text:
        raise ValueError("--prompts magpie: the model's chat template does not render a user turn's text")
    return text[:text.index(MARK)]


def clean(text: str, finished: bool) -> str | None:
    """The request as a user would send it, or None where the sample is unusable."""
    text = text.strip()
    if not finished or "<|" in text or len(text.split()) < MIN_WORDS:
        return None
    return text


def write_user_turns(llm: LLM, conversations: list[list[dict]], seed: int, max_tokens: int = 96,
                     temperature: float = 1.0, top_p: float = 0.95, opener_fraction: float = 0.0) -> list[str | None]:
    """One sampled user request per conversation (each a list of chat messages so far); a share
    ``opener_fraction`` of them begin with one of ``OPENERS``, which the model continues."""
    tokenizer = llm.get_tokenizer()
    rng = random.Random(seed)
    openers = [rng.choice(OPENERS) if rng.random() < opener_fraction else "" for _ in conversations]
    prompts = [user_turn_prefix(tokenizer, messages) + opener for messages, opener in zip(conversations, openers)]
    params = [SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                             seed=rng.randrange(2 ** 31)) for _ in prompts]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [clean(opener + o.outputs[0].text, o.outputs[0].finish_reason == "stop")
            for opener, o in zip(openers, outputs)]


class Deduplicator:
    """Remembers requests by their words (lower case, punctuation dropped)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    @staticmethod
    def key(text: str) -> str:
        return " ".join(re.findall(r"\w+", text.lower()))

    def first_time(self, text: str) -> bool:
        key = self.key(text)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True
