"""A deterministic, self-written demo corpus: invented entities described in short sectioned documents, with
keyword, question and reworded queries (one relevant document each) split into train / dev / test.

Nothing here comes from third-party text: names are made of random syllables and the sentences come from the
templates below. Documents share categories, regions, years and a Zipf-distributed pool of descriptive words,
and the reworded queries use synonyms that documents rarely contain, so retrieval is far from trivial (BM25
figures in docs/results.md).
"""

from __future__ import annotations

import numpy as np

from gr_jax.data.readers import Corpus, Dataset, QuerySet

_SYLLABLES = ["ka", "lo", "mer", "vin", "ta", "sor", "el", "du", "ran", "pe", "qui", "zen", "bo", "ri", "mal",
              "tho", "ne", "gar", "fu", "lis", "ora", "ven", "ash", "cor", "yul", "pim", "dra", "sel", "nu", "bek"]
# category → (word in documents, synonym used by reworded queries)
_CATEGORIES = [("river", "waterway"), ("festival", "celebration"), ("instrument", "music maker"),
               ("mineral", "crystal"), ("dish", "recipe"), ("bridge", "crossing"), ("dialect", "speech"),
               ("observatory", "star station"), ("textile", "fabric"), ("orchard", "fruit garden"),
               ("lighthouse", "beacon"), ("glacier", "ice field"), ("monastery", "cloister"),
               ("market", "bazaar"), ("canal", "channel"), ("vineyard", "wine estate")]
# descriptive word → synonym (queries of the reworded kind use the synonym)
_WORDS = [("ancient", "old"), ("narrow", "slim"), ("bright", "vivid"), ("quiet", "calm"), ("famous", "renowned"),
          ("copper", "bronze"), ("northern", "upper"), ("seasonal", "yearly"), ("carved", "sculpted"),
          ("fragrant", "aromatic"), ("steep", "sheer"), ("frozen", "icy"), ("woven", "braided"),
          ("golden", "gilded"), ("hidden", "secret"), ("coastal", "seaside"), ("painted", "decorated"),
          ("rare", "scarce"), ("restored", "renovated"), ("sacred", "holy"), ("wooden", "timber"),
          ("crowded", "busy"), ("misty", "foggy"), ("stone", "rock"), ("silver", "argent"), ("wild", "untamed"),
          ("salty", "briny"), ("tall", "lofty"), ("humble", "modest"), ("lively", "vibrant"), ("deep", "profound"),
          ("winding", "twisting"), ("sunny", "bright lit"), ("royal", "regal"), ("rural", "countryside"),
          ("busy", "bustling"), ("green", "verdant"), ("dusty", "arid"), ("grand", "majestic"), ("small", "tiny")]
_FEATURES = ["towers", "gardens", "songs", "markets", "tiles", "stairs", "bells", "lanterns", "murals", "arches",
             "boats", "spices", "looms", "terraces", "fountains", "pillars", "orchids", "drums", "kilns", "maps"]
_FILLER = ["Visitors often arrive in spring.", "Local guides tell many stories about it.",
           "Records from the archive mention it several times.", "It appears on most regional maps.",
           "Travellers describe the area as welcoming.", "Several families have lived nearby for generations.",
           "The surrounding land is used for farming.", "A small museum keeps objects related to it."]


def _name(rng: np.random.Generator, n_syllables: int) -> str:
    return "".join(rng.choice(_SYLLABLES, n_syllables)).capitalize()


def generate(num_docs: int = 2000, seed: int = 0, num_regions: int = 20, queries_per_doc: int = 4) -> Dataset:
    """The demo dataset: `num_docs` documents; per document `queries_per_doc` queries of rotating kinds, the
    last two going to dev and test, the others to train."""
    if num_docs < 10:
        raise ValueError("the demo corpus needs at least 10 documents")
    if queries_per_doc < 3:
        raise ValueError("queries_per_doc must be >= 3 (train, dev and test each need one)")
    rng = np.random.default_rng(seed)
    regions = sorted({_name(rng, 3) for _ in range(num_regions * 2)})[:num_regions]
    zipf = 1.0 / np.arange(1, len(_WORDS) + 1) ** 0.8
    zipf /= zipf.sum()
    names, seen = [], set()
    while len(names) < num_docs:
        n = _name(rng, int(rng.integers(2, 4)))
        if n not in seen:
            seen.add(n)
            names.append(n)
    docs = []
    for i, name in enumerate(names):
        cat, cat_syn = _CATEGORIES[rng.integers(len(_CATEGORIES))]
        words = rng.choice(len(_WORDS), 3, replace=False, p=zipf)
        feats = rng.choice(_FEATURES, 2, replace=False)
        docs.append(dict(name=name, cat=cat, cat_syn=cat_syn, region=regions[rng.integers(num_regions)],
                         year=int(rng.integers(1500, 2021)), founder=f"{_name(rng, 2)} {_name(rng, 3)}",
                         words=[_WORDS[w] for w in words], feats=list(feats),
                         related=names[int(rng.integers(num_docs))]))
    ids, texts, titles, urls = [], [], [], []
    for i, d in enumerate(docs):
        (w1, _), (w2, _), (w3, _) = d["words"]
        f1, f2 = d["feats"]
        filler = rng.choice(_FILLER, 2, replace=False)
        text = (f"Overview. {d['name']} is a {w1} {d['cat']} in {d['region']}. It is known for its {w2} {f1}. "
                f"History. {d['name']} was established around {d['year']} by {d['founder']}. {filler[0]} "
                f"Details. The {d['cat']} has {w3} {f2} and is often compared with {d['related']}. {filler[1]}")
        ids.append(f"doc{i:05d}")
        texts.append(text)
        titles.append(f"{d['name']} ({d['cat']})")
        urls.append(f"{d['cat']}/{d['region'].lower()}/{d['name'].lower()}")
    kinds = ("keyword", "question", "reworded")
    splits = {"train": ([], []), "dev": ([], []), "test": ([], [])}
    qrels = {"train": {}, "dev": {}, "test": {}}
    for i, d in enumerate(docs):
        for j in range(queries_per_doc):
            kind = kinds[(i + j) % 3]
            text = _query(kind, d, rng)
            split = "test" if j == queries_per_doc - 1 else "dev" if j == queries_per_doc - 2 else "train"
            qid = f"{split}-{i:05d}-{j}"
            splits[split][0].append(qid)
            splits[split][1].append(text)
            qrels[split][qid] = {ids[i]: 1}
    corpus = Corpus(ids, texts, titles, urls)
    return Dataset(corpus, {s: QuerySet(q, t) for s, (q, t) in splits.items()}, qrels,
                   {"query_kinds": kinds, "seed": seed})


def _query(kind: str, d: dict, rng: np.random.Generator) -> str:
    (w1, s1), (w2, s2), (w3, s3) = d["words"]
    f1, f2 = d["feats"]
    if kind == "keyword":
        picks = rng.choice([w1, w2, w3, f1, f2, d["cat"], d["region"]], int(rng.integers(2, 4)), replace=False)
        return " ".join(picks)
    if kind == "question":
        form = int(rng.integers(3))
        if form == 0:
            return f"which {d['cat']} in {d['region']} is known for {w2} {f1}"
        if form == 1:  # the century is not written in the document: only the other words match
            return f"who established the {w1} {d['cat']} in the {d['year'] // 100 + 1}th century"
        return f"what {d['cat']} has {w3} {f2}"
    # reworded: synonyms instead of the document's words
    where = f" near {d['region']}" if rng.random() < 0.5 else ""
    return f"{s1} {d['cat_syn']} with {s2} {f1}{where}"
