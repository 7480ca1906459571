"""A dataset of real English made from what every install has: the documented modules, classes, functions and
methods of the Python standard library, read from its source files with `ast` (nothing is imported or run).

For each public object whose docstring has a summary and more:
* query = the docstring's summary: the first sentence of its first paragraph (PEP 257's summary line, joined
  where it is wrapped over several lines),
* document = the signature (`name(args)` / `class Name(bases)`) and the rest of the docstring, whitespace
  collapsed — the summary itself is not in the document,
* title = the qualified name (`json.dumps`), which is also the document id,
* URL = its page in the library reference, docs.python.org/3/library/<top module>.html#<qualified name>.

Deterministic for a given Python version and order-free: files are read in sorted order, a document whose text
repeats another's is dropped (the smaller id is kept), a summary that several documents share is not a query
(it would be ambiguous), and each query's split is drawn from a hash of its id: 10% test, 10% dev, 80% train.
`max_documents` keeps the documents with the smallest hashes of their ids (a subset that does not depend on
order either). Skipped: private names (a leading underscore) and the packages test, tests, idlelib, lib2to3,
turtledemo, ensurepip, venv and site-packages. Modules with side effects on import (antigravity, this) are read
like any other: their source is parsed, never run.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import logging
import re
import sys
import sysconfig
from pathlib import Path
from typing import Optional

from gr_jax.data.readers import Corpus, Dataset, QuerySet

log = logging.getLogger(__name__)

SKIP_PACKAGES = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "ensurepip", "venv"}
MIN_QUERY_WORDS = 3
MIN_DOCUMENT_WORDS = 5


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _modules(root: Path) -> list[tuple[str, Path]]:
    """(module name, file) of the public pure-Python standard-library modules, sorted by name."""
    public = {m for m in getattr(sys, "stdlib_module_names", ()) if not m.startswith("_")}
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not parts or parts[0] not in public or any(p.startswith("_") or p in SKIP_PACKAGES for p in parts):
            continue
        out.append((".".join(parts), path))
    return sorted(out)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*(\[\"'])")


def _split_docstring(doc: Optional[str]) -> Optional[tuple[str, str]]:
    """(summary, rest): the summary is the first sentence of the first paragraph, however many lines it is
    wrapped over (a wrapped first line alone would be a fragment whose other half sits in the document)."""
    if not doc:
        return None
    text = doc.strip()
    paragraph, _, after = text.partition("\n\n")
    paragraph = " ".join(paragraph.split())
    first, more = (_SENTENCE_END.split(paragraph, maxsplit=1) + [""])[:2]
    rest = " ".join(f"{more} {after}".split())
    if len(first.split()) < MIN_QUERY_WORDS or len(rest.split()) < MIN_DOCUMENT_WORDS:
        return None
    return first, rest


def _signature(node) -> str:
    try:
        if isinstance(node, ast.ClassDef):
            bases = ", ".join(ast.unparse(b) for b in node.bases)
            return f"class {node.name}({bases})" if bases else f"class {node.name}"
        return f"{node.name}({ast.unparse(node.args)})"
    except (ValueError, TypeError, RecursionError):  # an expression ast.unparse cannot write back
        return node.name


def _entries(module: str, tree: ast.Module):
    """(qualified name, signature, docstring) of the module, its public classes and functions, and the public
    methods of its public classes."""
    yield module, f"module {module}", ast.get_docstring(tree, clean=True)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            yield f"{module}.{node.name}", _signature(node), ast.get_docstring(node, clean=True)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
                        yield (f"{module}.{node.name}.{item.name}", _signature(item),
                               ast.get_docstring(item, clean=True))


@functools.lru_cache(maxsize=2)
def _collect(root: str) -> tuple:
    """Every kept (doc id, query, document, URL), sorted by doc id."""
    by_id: dict[str, tuple[str, str, str]] = {}
    for module, path in _modules(Path(root)):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError) as e:
            log.debug("pydoc: skipping %s (%s)", path, e)
            continue
        top = module.split(".")[0]
        for name, signature, doc in _entries(module, tree):
            parts = _split_docstring(doc)
            if parts is None or name in by_id:
                continue
            by_id[name] = (parts[0], f"{signature} {parts[1]}",
                           f"docs.python.org/3/library/{top}.html#{name}")
    first_of_text: dict[str, str] = {}
    for doc_id in sorted(by_id):  # a repeated document keeps its smallest id
        first_of_text.setdefault(by_id[doc_id][1], doc_id)
    kept = sorted(first_of_text.values())
    return tuple((d, *by_id[d]) for d in kept)


def generate(max_documents: int = 0, root: Optional[str] = None) -> Dataset:
    """The dataset (splits train / dev / test); `max_documents` > 0 keeps that many (by the hash of their ids)."""
    root = root or sysconfig.get_paths()["stdlib"]
    rows = list(_collect(str(root)))
    if not rows:
        raise ValueError(f"pydoc: no documented module found under {root}")
    if max_documents and max_documents < len(rows):
        keep = set(sorted((r[0] for r in rows), key=lambda d: (_hash(d), d))[:max_documents])
        rows = [r for r in rows if r[0] in keep]
    count: dict[str, int] = {}
    for _, query, _, _ in rows:
        count[query] = count.get(query, 0) + 1
    corpus = Corpus([r[0] for r in rows], [r[2] for r in rows], titles=[r[0] for r in rows],
                    urls=[r[3] for r in rows])
    queries: dict[str, tuple[list, list]] = {"train": ([], []), "dev": ([], []), "test": ([], [])}
    qrels: dict[str, dict] = {"train": {}, "dev": {}, "test": {}}
    for doc_id, query, _, _ in rows:
        if count[query] > 1:
            continue
        qid = f"q:{doc_id}"
        bucket = _hash(qid) % 10
        split = "test" if bucket == 0 else "dev" if bucket == 1 else "train"
        queries[split][0].append(qid)
        queries[split][1].append(query)
        qrels[split][qid] = {doc_id: 1}
    data = Dataset(corpus, {s: QuerySet(*queries[s]) for s in queries}, qrels,
                   extras={"python": ".".join(map(str, sys.version_info[:2]))})
    log.info("pydoc: %d documents, queries %s (Python %s)", len(corpus),
             {s: len(q) for s, q in data.queries.items()}, data.extras["python"])
    return data


