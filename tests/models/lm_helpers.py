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
