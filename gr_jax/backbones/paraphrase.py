"""The LM paraphraser of the robustness protocol (a `data.variations` generator for the 'paraphrase' variation):
a decoder-only LM (default: SmolLM2-135M-Instruct, offline) continues a few-shot prompt "Query: … /
Paraphrase: …" with sampling. Of `samples` draws per query, the first that is not empty, not the query itself
(case and spacing ignored), not more than twice as long and keeping at least `min_shared` of the query's
content words (not stop words; exact word forms) is kept — a small LM drifts off topic, and this keeps the intent check cheap
and explicit; a query with none gets the rule-based paraphrase (`RuleParaphraser`), counted in `fallbacks`.

Queries are taken in query-id order, `batch_size` a batch, and the batch that starts at the i-th query id
samples with seed `seed + i`: the result depends on the seed and the set of queries, not on their order.
The few-shot prefix is prefilled once and shared by every prompt.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import gin

from gr_jax.data.variations import RuleParaphraser, split_word, stop_words
from gr_jax.backbones import lm_generate
from gr_jax.backbones.lm import LMContext
from gr_jax.runtime.validation import Count, Fraction, Positive

log = logging.getLogger(__name__)

# demonstrations of our own (intent kept, surface changed)
DEMONSTRATIONS = (("how do i make cold brew coffee at home", "steps for making cold brew coffee yourself"),
                  ("what is the population of canada", "how many people live in canada"),
                  ("symptoms of iron deficiency", "what are the signs of low iron"))


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LMParaphraser:
    lm: str = "smollm2_135m"
    samples: Count = 3
    max_new_tokens: Count = 24
    temperature: Positive = 0.8
    top_k: Count = 40
    batch_size: Count = 16
    min_shared: Fraction = 0.5
    demonstrations: tuple = DEMONSTRATIONS
    name = "paraphrase"

    def _context(self) -> LMContext:
        if not hasattr(self, "_ctx"):
            ctx, digest = LMContext.load(self.lm)
            object.__setattr__(self, "_ctx", ctx)
            object.__setattr__(self, "_digest", digest)
        return self._ctx

    def settings(self) -> dict:
        self._context()
        return {"paraphraser": "lm", "lm": self._digest, "samples": self.samples,
                "max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_k": self.top_k,
                "batch_size": self.batch_size, "min_shared": self.min_shared, "demonstrations": [list(d) for d in self.demonstrations]}

    def prefix(self) -> str:
        return "".join(f"Query: {q}\nParaphrase: {p}\n\n" for q, p in self.demonstrations)

    def acceptable(self, source: str, candidate: str) -> bool:
        def words(t):
            return [split_word(w)[1].lower() for w in t.split()]

        content = lambda t: {w for w in words(t) if w and w not in stops}  # noqa: E731
        stops = stop_words()
        return bool(candidate.strip()) and words(candidate) != words(source) \
            and len(candidate.split()) <= 2 * max(1, len(source.split())) \
            and len(content(source) & content(candidate)) >= self.min_shared * len(content(source))

    def vary(self, texts: Sequence[str], qids: Sequence[str], seed: int) -> list[str]:
        ctx = self._context()
        prefix = ctx.prefix_cache(self.prefix())
        order = sorted(range(len(texts)), key=lambda i: qids[i])
        out: dict[int, str] = {}
        fallbacks = []
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            prompts = [ctx.encode(f"Query: {' '.join(texts[i].split())}") + [ctx.newline_id]
                       + ctx.encode("Paraphrase:") for i in rows]
            gen = lm_generate.generate(ctx.model, ctx.params, prompts, max_new_tokens=self.max_new_tokens,
                                       min_new_tokens=1, stop_ids=ctx.line_stops, num_samples=self.samples,
                                       greedy=False, temperature=self.temperature, top_k=self.top_k,
                                       seed=seed + start, prefix=prefix)
            for j, i in enumerate(rows):
                drawn = [ctx.tok.decode(g).strip() for g in gen[j * self.samples:(j + 1) * self.samples]]
                good = [d for d in drawn if self.acceptable(texts[i], d)]
                if good:
                    out[i] = good[0]
                else:
                    fallbacks.append(i)
        if fallbacks:
            rule = RuleParaphraser().vary([texts[i] for i in fallbacks], [qids[i] for i in fallbacks], seed)
            out.update(zip(fallbacks, rule))
            log.info("LM paraphraser: %d of %d queries had no acceptable sample; rule-based paraphrase used",
                     len(fallbacks), len(texts))
        object.__setattr__(self, "fallbacks", len(fallbacks))
        return [out[i] for i in range(len(texts))]
