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
