"""tools/rq_generalisation.py's pieces by hand (the whole tool encodes pydoc with MiniLM: a measurement, not a
test): the windows of a text, Hit@10 of a tiny exact search, and its refusal of a malformed --settings."""

import numpy as np
import pytest

from tests.conftest import tool


def test_windows_of_a_text_by_hand():
    rq = tool("rq_generalisation")
    words = " ".join(f"w{i}" for i in range(60))
    windows = rq.windows_of([words, "short text"], width=48, stride=24)
    assert windows[0].split()[0] == "w0" and len(windows[0].split()) == 48
    assert windows[1].split()[0] == "w24" and windows[1].split()[-1] == "w59"  # the last window may be short
    assert windows[-1] == "short text"  # a text shorter than a window is one window


def test_hit_at_10_by_hand():
    rq = tool("rq_generalisation")
    docs = np.eye(12, dtype=np.float32)
    queries = np.stack([docs[0], docs[11]])
    assert rq.hit_at_10(queries, docs, [{0}, {11}]) == 1.0
    # query 0 scores document 0 at 1 and the others at 0: its top 10 is rows 0..9 (ties kept in row order), so
    # row 11 is out of it; query 1 finds row 11 first
    assert rq.hit_at_10(queries, docs, [{11}, {11}]) == 0.5


def test_a_malformed_setting_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        tool("rq_generalisation").main(["--out", "x.md", "--settings", "8by256"])
    assert e.value.code == 2 and "MxK" in capsys.readouterr().err
