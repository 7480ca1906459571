"""The pydoc dataset: a hand-made standard-library tree read exactly, and the real one's invariants."""

import hashlib
import textwrap

import pytest

from gr_jax.data import pydoc, sources


def _tree(tmp_path):
    files = {
        "json/__init__.py": '''
            """JSON encoder and decoder. Serialises Python objects to text and back again for you."""

            def dumps(obj, *, indent=None):
                """Serialize obj to a JSON formatted str.

                Use indent to pretty-print the output with that many spaces."""

            def _private(x):
                """A private helper. It is never part of the dataset at all."""

            class JSONThing(object):
                """Thing that holds a JSON value.
                It keeps one value and returns it on demand."""

                def get(self):
                    """Return the value. It was given when the thing was made."""

                def _hidden(self):
                    """Hidden method here. Not a public name so it is skipped."""
            ''',
        "json/_speedups.py": '"""Private module docstring. Never read by the dataset at all."""',
        "string.py": '''
            def capwords(s, sep=None):
                """Split, capitalise and join the words. Uses str.split and str.join on each word."""

            def get(self):
                """Return the value. It was given when the thing was made."""

            def tiny(s):
                """Too short."""

            def same(s):
                """Return the value. The doc differs here so it is another document."""
            ''',
        "test/test_json.py": '"""Test suite for json. It is skipped as a test package."""',
        "not_a_stdlib_module.py": '"""Something else entirely. Not in sys.stdlib_module_names at all."""',
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    pydoc._collect.cache_clear()
    return tmp_path


def test_a_small_tree_by_hand(tmp_path):
    data = pydoc.generate(root=str(_tree(tmp_path)))
    c = data.corpus
    # json.JSONThing.get and string.get have the same document text: the smaller id (json.JSONThing.get) is kept
    assert list(c.doc_ids) == ["json", "json.JSONThing", "json.JSONThing.get", "json.dumps", "string.capwords",
                               "string.same"]
    text = dict(zip(c.doc_ids, c.texts))
    assert text["json.dumps"] == "dumps(obj, *, indent=None) Use indent to pretty-print the output with that many spaces."
    assert text["json.JSONThing"] == "class JSONThing(object) It keeps one value and returns it on demand."
    assert text["json"] == "module json Serialises Python objects to text and back again for you."
    assert dict(zip(c.doc_ids, c.urls))["string.capwords"] == "docs.python.org/3/library/string.html#string.capwords"
    assert list(c.titles) == list(c.doc_ids)
    queries = {q: t for s in data.queries.values() for q, t in zip(s.qids, s.texts)}
    # "Return the value." summarises two kept documents: not a query
    assert queries == {"q:json": "JSON encoder and decoder.", "q:json.JSONThing": "Thing that holds a JSON value.",
                       "q:json.dumps": "Serialize obj to a JSON formatted str.",
                       "q:string.capwords": "Split, capitalise and join the words."}
    for split, qs in data.queries.items():  # the split of each query: a hash of its id, 10% test, 10% dev
        for q in qs.qids:
            bucket = int.from_bytes(hashlib.blake2b(q.encode(), digest_size=8).digest(), "big") % 10
            assert split == ("test" if bucket == 0 else "dev" if bucket == 1 else "train")
            assert data.qrels[split][q] == {q[2:]: 1}
    small = pydoc.generate(max_documents=3, root=str(tmp_path))
    by_hash = sorted(c.doc_ids, key=lambda d: int.from_bytes(hashlib.blake2b(d.encode(), digest_size=8).digest(),
                                                                 "big"))
    assert sorted(small.corpus.doc_ids) == sorted(by_hash[:3])


@pytest.mark.slow
def test_the_standard_library_dataset():
    pydoc._collect.cache_clear()
    data = sources.load_dataset("pydoc")
    c = data.corpus
    assert len(c) > 1000 and all(len(data.queries[s]) > 100 for s in ("train", "dev", "test"))
    assert len(set(c.doc_ids)) == len(c) and len(set(c.texts)) == len(c)
    text = dict(zip(c.doc_ids, c.texts))
    inside = sum(t in text[q[2:]] for s in data.queries.values() for q, t in zip(s.qids, s.texts))
    assert inside < 0.05 * sum(len(s) for s in data.queries.values())  # the summary is not in its document
    pydoc._collect.cache_clear()
    again = sources.load_dataset("pydoc", pydoc_documents=500)
    assert len(again.corpus) == 500 and set(again.corpus.doc_ids) <= set(c.doc_ids)
    assert all(text[d] == t for d, t in zip(again.corpus.doc_ids, again.corpus.texts))


def test_an_empty_root_is_an_error(tmp_path):
    pydoc._collect.cache_clear()
    with pytest.raises(ValueError, match="no documented module found under"):
        pydoc.generate(root=str(tmp_path))
