"""PAG's docids: TF-IDF set docids by hand, the released JSON files (read, validated, mapped onto a corpus),
the table's extras through save/load and concatenation, and the scheme's stale-file check."""

import json

import numpy as np
import pytest

from gr_jax.methods.pag import docids as pag_docids
from gr_jax.docids.base import DocidTable


def test_tfidf_set_ids_by_hand():
    idf = np.array([9.0, 9.0, 9.0, 1.0, 2.0, 0.5, 3.0])
    # doc 0: token 3 ×2 (w 2), 4 ×1 (w 2), 6 ×1 (w 3), 5 ×1 (w 0.5); ids < 3 never enter
    got = pag_docids.tfidf_set_ids([[3, 3, 4, 6, 5, 1, 0], [5], []], idf, 3)
    assert got.tolist() == [[6, 3, 4], [5, -1, -1], [-1, -1, -1]]  # 3 and 4 tie at 2.0: the lower id first


def test_order_keys_depend_on_the_id_alone():
    a = pag_docids.order_keys(["d1", "d2", "d3"])
    b = pag_docids.order_keys(["d3", "d1"])
    assert a[0] == b[1] and a[2] == b[0] and (a >= 0).all() and len(set(a.tolist())) == 3


def _write(path, obj):
    path.write_text(json.dumps(obj))
    return path


def test_released_files_map_onto_the_corpus_and_bad_files_are_named(tmp_path):
    smt = _write(tmp_path / "smt.json", {"a": [10, 14, 18], "b": [11, 15, 16]})
    lex = _write(tmp_path / "lex.json", {"a": [5, 6, 7, 8], "b": [9, 8, 7, 6]})
    t = pag_docids.table_from_files(smt, lex, ["b", "a"], levels=3, k=3, base=10, set_size=2)
    assert t.sequences.tolist() == [[11, 15, 16], [10, 14, 18]] and t.doc_rows.tolist() == [0, 1]
    assert t.extras["set_ids"].tolist() == [[9, 8], [5, 6]]  # the first m of each list
    with pytest.raises(ValueError, match="no entry for 1 corpus documents"):
        pag_docids.table_from_files(smt, lex, ["a", "c"], levels=3, k=3, base=10)
    with pytest.raises(ValueError, match="base \\+ K·level \\+ code"):
        pag_docids.table_from_files(smt, lex, ["a"], levels=3, k=3, base=11)  # 10 is below base 11
    bad = _write(tmp_path / "bad.json", {"a": [10, "x", 12]})
    with pytest.raises(ValueError, match="bad.json: docid 'a' maps to"):
        pag_docids.read_docid_to_tokenids(bad)
    ragged = _write(tmp_path / "ragged.json", {"a": [10, 11], "b": [12]})
    with pytest.raises(ValueError, match="different lengths"):
        pag_docids.read_docid_to_tokenids(ragged)


def test_table_extras_survive_save_load_and_concatenation(tmp_path):
    smt = _write(tmp_path / "smt.json", {"a": [10, 14, 18], "b": [11, 15, 16]})
    lex = _write(tmp_path / "lex.json", {"a": [5, 6], "b": [9, 8]})
    t = pag_docids.table_from_files(smt, lex, ["a", "b"], levels=3, k=3, base=10)
    t.save(tmp_path / "table")
    back = DocidTable.load(tmp_path / "table")
    assert sorted(back.extras) == ["order_key", "set_ids"]
    np.testing.assert_array_equal(back.extras["set_ids"], t.extras["set_ids"])
    both = DocidTable.concatenate([t, back])
    assert both.extras["set_ids"].shape == (4, 2)
    plain = DocidTable(t.sequences, t.lengths, t.doc_rows, t.space)
    with pytest.raises(ValueError, match="different extras"):
        DocidTable.concatenate([t, plain])
    with pytest.raises(ValueError, match="one row per docid"):
        DocidTable(t.sequences, t.lengths, t.doc_rows, t.space, extras={"set_ids": np.zeros((3, 2))})


def test_a_changed_docid_file_is_refused_when_the_scheme_state_is_loaded(tmp_path):
    smt = _write(tmp_path / "smt.json", {"a": [10, 14, 18]})
    lex = _write(tmp_path / "lex.json", {"a": [5, 6]})
    scheme = pag_docids.PagDocids(levels=3, k=3, base=10, set_size=2, docid_file=str(smt), set_docid_file=str(lex))
    scheme.fit(None)
    meta, arrays = scheme.state()
    _write(smt, {"a": [11, 14, 18]})
    again = pag_docids.PagDocids(levels=3, k=3, base=10, set_size=2, docid_file=str(smt), set_docid_file=str(lex))
    with pytest.raises(ValueError, match="PagDocids.docid_file .*changed since this MODEL_DIR"):
        again.load_state(meta, arrays)
