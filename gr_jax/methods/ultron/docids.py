"""Ultron's URL docids, as its authors' code builds them: the URL lower-cased, its scheme stripped, `-_?=+`
made spaces, `.html` / `.php` / `.aspx` dropped; when the title has more than two words the docid is the title
and the domain, otherwise the path's segments reversed, without digits, and the domain. A URL without a domain
(no dot in its first segment, e.g. the demo's "orchard/dramernu/bobeksor") has only the reversed path."""

from __future__ import annotations

import dataclasses
import re

import gin

from gr_jax.methods.api import Count, FieldDocids


def ultron_url(url: str, title: str = "") -> str:
    u = re.sub(r"^[a-z][a-z0-9+.\-]*://", "", (url or "").strip().lower())
    u = re.sub(r"[-_?=+]", " ", u)
    u = re.sub(r"\.(html|php|aspx)\b", "", u)
    segments = [s for s in u.split("/") if s.strip()]
    domain = segments.pop(0) if segments and "." in segments[0] else ""
    path = re.sub(r"\d", "", " ".join(reversed(segments)))
    head = title.strip() if title and len(title.split()) > 2 else path
    return " ".join(f"{head} {domain}".split())


@gin.configurable
@dataclasses.dataclass
class UltronUrlDocids(FieldDocids):
    """`FieldDocids` on the URL field, rewritten by `ultron_url` (the title from the corpus when it has one)."""

    field: str = "url"
    max_tokens: Count = 99  # Ultron keeps 99 tokens and EOS

    @property
    def name(self) -> str:
        return "ultron_url"

    def field_text(self, corpus, row: int) -> str:
        title = corpus.titles[row] if corpus.titles is not None else ""
        return ultron_url(corpus.urls[row], title)
