"""Test helpers for decoder-only LMs: a small byte-level BPE tokenizer trained on the given texts (the kind a
GGUF file describes), standing in for a pretrained model's."""

from __future__ import annotations


def train_byte_bpe(texts, vocab_size: int, specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>")):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(list(texts), trainer)
    return backend


def tiny_lm_context(num_docs: int = 80, seed: int = 1):
    """(LMContext of a tiny random Llama with a byte-level BPE tokenizer trained on the demo corpus and the
    few-shot prompt, the demo dataset it was trained on). Weights scaled up so that the logits spread."""
    import jax

    from gr_jax.data import demo
    from gr_jax.backbones import llama, lm_tokenizer
    from gr_jax.methods.fewshot.model import FewShotPrompt
    from gr_jax.backbones.lm import LMContext

    d = demo.generate(num_docs=num_docs, seed=seed)
    backend = train_byte_bpe(list(d.corpus.texts) + [FewShotPrompt().prefix()], 420,
                             ("<|endoftext|>", "<s>", "</s>"))
    tok = lm_tokenizer.LMTokenizer(backend, bos_id=1, eos_id=2, pad_id=2)
    config = llama.get_config("llama_tiny", vocab_size=tok.vocab_size, pad_token_id=2)
    params = llama.init_params(config, seed=7)
    params = jax.tree_util.tree_map(lambda p: p * 6.0 if p.ndim == 2 else p, params)
    return LMContext(llama.Llama(config), params, tok, name="tiny"), d
