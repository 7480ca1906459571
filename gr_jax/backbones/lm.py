"""A pretrained decoder-only LM as the methods and protocols use it (`LMContext`: the loaded model, its
tokenizer, the newline token that ends a generated line, prefilled prompt prefixes), and LM-written
pseudo-queries (`PseudoQueryGenerator`, InPars-style), shared by Few-Shot GR's indexing, `python -m
gr_jax.pseudo_queries` (pseudo-query docids and objectives), the LM paraphraser and the LM translator.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import gin

from gr_jax.backbones import llama, lm_generate
from gr_jax.runtime.validation import Count, Positive

# InPars-style pseudo-query prompt: document → a query it answers. Three demonstrations of our own.
QG_DEMONSTRATIONS = (
    ("The Danube flows through ten countries, more than any other river in the world, and ends in the Black Sea.",
     "which river flows through the most countries"),
    ("Sourdough bread is leavened by wild yeast and lactic acid bacteria kept alive in a starter of flour and "
     "water.", "what makes sourdough bread rise"),
    ("The observatory on the hill was built in 1910 and houses a refracting telescope that visitors may use "
     "on clear nights.", "when was the hill observatory built"),
)


def clean_text(text: str) -> str:
    """The text on one line, runs of white space as one space."""
    return " ".join(str(text).split())



@gin.configurable
@dataclasses.dataclass(frozen=True)
class PseudoQueryGenerator:
    """InPars-style pseudo-queries: three demonstrations "Document: … / Relevant query: …", then the document;
    n queries sampled per document (top-k / temperature), ended by a newline. Feeds Few-Shot GR's indexing, and
    `python -m gr_jax.pseudo_queries` writes its queries to a file for `PseudoQueryDocids(source='file')` and
    the pseudo-query objective (`Objectives.pseudo_queries_file`)."""

    demonstrations: tuple = QG_DEMONSTRATIONS
    max_document_tokens: Count = 160
    max_query_tokens: Count = 24
    temperature: Positive = 1.0
    top_k: Count = 40

    def prefix(self) -> str:
        return "".join(f"Document: {d}\nRelevant query: {q}\n\n" for d, q in self.demonstrations)

    def generate(self, lm: "LMContext", texts: Sequence[str], num_queries: int, seed: int, batch_size: int = 16,
                 progress=None) -> list[list[str]]:
        """`num_queries` sampled queries per text, `batch_size` texts a batch (the batch that starts at text i
        samples with seed `seed + i`: the same texts, seed and batch size give the same queries). A generation
        that decodes to nothing but whitespace is replaced by the text's first 80 characters, so every text has
        its queries."""
        prefix = lm.prefix_cache(self.prefix())
        out: list[list[str]] = []
        for start, end in batches(len(texts), batch_size):
            prompts = [lm.encode("Document: ") + lm.encode(clean_text(t))[:self.max_document_tokens] + [lm.newline_id]
                       + lm.encode("Relevant query:") for t in texts[start:end]]
            gen = lm_generate.generate(lm.model, lm.generation_params, prompts,
                                       max_new_tokens=self.max_query_tokens,
                                       min_new_tokens=2, stop_ids=lm.line_stops, num_samples=num_queries,
                                       greedy=False, temperature=self.temperature, top_k=self.top_k,
                                       seed=seed + start, prefix=prefix)
            n = num_queries
            out += [[lm.tok.decode(g).strip() or texts[start + i][:80] for g in gen[i * n:(i + 1) * n]]
                    for i in range(end - start)]
            if progress is not None:
                progress.update(end - start)
        return out


class LMContext:
    """A loaded decoder-only LM with its tokenizer and the token-level pieces the prompts need."""

    def __init__(self, model: llama.Llama, params, tokenizer, name: str = "lm"):
        self.model, self.params, self.tok, self.name = model, params, tokenizer, name
        self.newline_id = tokenizer.encode("\n")
        if len(self.newline_id) != 1:
            raise ValueError(f"{name}: the tokenizer writes a newline as {len(self.newline_id)} tokens; docids "
                             f"end with a single newline token")
        self.newline_id = self.newline_id[0]
        # every token whose text holds a newline ends a generated line (docid or pseudo-query)
        vocab = tokenizer.backend.get_vocab()
        self.line_stops = sorted({i for t, i in vocab.items() if "Ċ" in t or "\n" in t} | {tokenizer.eos_id})
        self._prefixes: dict[str, llama.LMCache] = {}
        self._stacked: tuple = (None, None)

    @classmethod
    def load(cls, spec: str) -> tuple["LMContext", str]:
        """(context, weight digest) of a named LM, a GGUF file or an HF Llama directory (`llama_io.load_lm`)."""
        from gr_jax.backbones import llama_io

        config, params, tok, digest = llama_io.load_lm(spec)
        return cls(llama.Llama(config), params, tok, name=spec), digest

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text)

    @property
    def generation_params(self):
        """`params` with the layers stacked once (`llama.with_stacked_layers`) where the network scans them, so a
        generation call reads the stack instead of copying every layer's weights into one, and their
        projections fused (`llama.fuse_projections`); kept while `params` is the same object."""
        if self._stacked[0] is not self.params:
            stacked = (llama.with_stacked_layers(self.params, self.model.config, fused=True)
                       if self.model.scan_layers else self.params)
            self._stacked = (self.params, stacked)
        return self._stacked[1]

    def prefix_cache(self, text: str) -> llama.LMCache:
        if text not in self._prefixes:
            self._prefixes[text] = llama.prefix_cache(self.model, self.params, self.encode(text))
        return self._prefixes[text]


def batches(n: int, size: int):
    """(start, end) of consecutive batches of `size` over n items."""
    for start in range(0, n, size):
        yield start, min(n, start + size)
