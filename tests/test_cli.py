"""`draftwise generate`: prints the text and the speed; bad input is one clear line and exit 2."""
from draftwise import LLM, SamplingParams
from draftwise.cli import main


def test_generate_prints_text_and_speed(tiny_model_dir, capsys):
    code = main(["generate", "--model", str(tiny_model_dir), "--dtype", "float32",
                 "--prompt", "The quick brown fox", "--max-tokens", "6", "--ignore-eos"])
    out, err = capsys.readouterr()
    assert code == 0
    expected = LLM(model=str(tiny_model_dir), dtype="float32").generate(
        "The quick brown fox", SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
        use_tqdm=False)[0].outputs[0].text
    assert out == expected + "\n"
    assert "6 tokens in" in err and "tokens/s" in err


def test_generate_bad_value_is_one_line_error(tiny_model_dir, capsys):
    code = main(["generate", "--model", str(tiny_model_dir), "--prompt", "hi", "--temperature", "-1"])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("draftwise: error:") and "temperature" in err


def test_serve_bounds_prefill_by_default_and_generate_does_not():
    from draftwise.cli import SERVE_DECODE_STALL_FACTOR, build_parser, engine_kwargs

    parse = lambda *argv: engine_kwargs(build_parser().parse_args(list(argv)))["decode_stall_factor"]  # noqa: E731
    assert parse("serve", "m") == SERVE_DECODE_STALL_FACTOR == 2.75
    assert parse("serve", "m", "--decode-stall-factor", "off") is None
    assert parse("serve", "m", "--decode-stall-factor", "2") == 2.0
    assert parse("generate", "--prompt", "x") is None
