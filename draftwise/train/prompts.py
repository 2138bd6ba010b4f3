"""``instruct``: a built-in set of training prompts for ``draftwise make-data``.

Chat requests made from task templates crossed with topics (advice, explanations,
stories, lists, emails, comparisons, short code tasks). None of them is a prompt of
the ``chat`` benchmark workload, so a drafter trained on them is measured there on
unseen prompts. ``load_instruct(num, seed)`` returns ``num`` distinct prompts
(``BenchPrompt`` with chat messages), shuffled by ``seed``.
"""
from __future__ import annotations

import itertools
import random

from ..bench.workloads import BenchPrompt

TOPICS = (
    "saving money", "learning a new language", "growing tomatoes", "sleeping better", "public speaking",
    "starting a podcast", "training a puppy", "cooking rice", "writing a resume", "time management",
    "climate change", "black holes", "the water cycle", "photosynthesis", "the French Revolution",
    "the internet", "electric cars", "volcanoes", "honey bees", "the human heart", "solar panels",
    "machine learning", "the stock market", "recycling", "meditation", "chess openings", "marathon training",
    "camping in the mountains", "moving to a new city", "first-time home buying", "composting",
    "the Roman Empire", "earthquakes", "rainbows", "coffee brewing", "baking bread", "painting with watercolours",
    "learning the guitar", "job interviews", "team leadership", "online privacy", "password security",
    "the moon landing", "ocean tides", "dinosaurs", "the immune system", "healthy breakfasts", "houseplants",
    "birdwatching", "renting an apartment", "negotiating a salary", "studying for exams", "volunteering",
)

TASKS = (
    "Explain {topic} in simple terms.",
    "Give me five practical tips about {topic}.",
    "Write a short story that involves {topic}.",
    "What are the most common mistakes people make with {topic}?",
    "Write a friendly email to a colleague about {topic}.",
    "Summarise the key facts about {topic} in a few bullet points.",
    "Write a short poem about {topic}.",
    "What should a beginner know about {topic}?",
    "Give me a step-by-step plan for {topic}.",
    "What are the pros and cons of {topic}?",
    "Write a blog post introduction about {topic}.",
    "Answer like a teacher: why does {topic} matter?",
    "Create a short quiz with three questions about {topic}.",
    "Describe {topic} to a five-year-old.",
    "Write a tweet about {topic}.",
    "What are three interesting facts about {topic}?",
)

CODE_TASKS = (
    "Write a Python function that {task}.",
    "Write a Python function that {task}, with a docstring and type hints.",
    "Show me how to {task} in Python, with a short explanation.",
)

CODE_TOPICS = (
    "reverses a string", "checks whether a number is prime", "counts the words in a text",
    "finds the largest element in a list", "merges two sorted lists", "computes the factorial of n",
    "removes duplicates from a list while keeping order", "converts Celsius to Fahrenheit",
    "checks whether a string is a palindrome", "returns the n-th Fibonacci number", "flattens a nested list",
    "reads a CSV file and sums a column", "validates an email address with a regular expression",
    "computes the average of a list of numbers", "sorts a list of dictionaries by a key",
    "counts the vowels in a string", "finds the common elements of two lists", "capitalises every word",
    "computes the greatest common divisor of two numbers", "groups words by their first letter",
)


def all_instructions() -> list[str]:
    chat = [task.format(topic=topic) for topic, task in itertools.product(TOPICS, TASKS)]
    code = [task.format(task=topic) for topic, task in itertools.product(CODE_TOPICS, CODE_TASKS)]
    return chat + code


def load_instruct(num_prompts: int | None = None, seed: int = 0) -> list[BenchPrompt]:
    texts = all_instructions()
    random.Random(seed).shuffle(texts)
    texts = texts[:num_prompts] if num_prompts is not None else texts
    return [BenchPrompt(f"instruct/{i:04d}", [{"role": "user", "content": text}]) for i, text in enumerate(texts)]
