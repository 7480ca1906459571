"""Hostile inputs on the newer surfaces, by class (each test failed on the code before these fixes):

1. a reused result is checked against its content digest, not its recipe alone (the stored released evaluation:
   tests/protocols/test_released.py; the vector cache: tests/docids/test_vector_cache.py);
2. formats read as strictly as their own tool reads them (fairseq's dict.txt, a TSV corpus's header);
3. one message and no traceback where a checkpoint or a cache is written (a full disk inside orbax's save, the
   test cache setting);
4. messages that name what is wrong (the global a checkpoint pickles, the cut fixture file and line, the config
   class a checkpoint does not match);
5. settings and inputs checked before any work (a scorer's name at gin parse, a release's answers file before
   any child runs, every command with a bad DATA_DIR leaves MODEL_DIR as it was)."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from gr_jax.backbones import bart_tokenizer
from gr_jax.backbones.t5_convert import CheckpointError, CheckpointMismatchError
from gr_jax.data.readers import DataError, read_corpus
from gr_jax.runtime import gin_utils
from tests.conftest import require


# -- 2. formats ----------------------------------------------------------------------------------------------

def _fairseq_tokenizer(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "encoder.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2, "c": 3}))
    (folder / "vocab.bpe").write_text("#version: 0.2\na b\n")
    (folder / "dict.txt").write_text("".join(line + "\n" for line in lines))
    return folder


DICT = ["0 100", "1 90", "2 80", "3 70", "madeupword0000 0"]


def test_dict_txt_is_read_as_fairseq_reads_it(tmp_path):
    ok = _fairseq_tokenizer(tmp_path / "ok", DICT)
    vocab, _, size = bart_tokenizer.bart_vocab(ok)
    assert size == 4 + len(DICT) + 1 and vocab["ab"] == 6 and vocab["madeupword0000"] == 8 and vocab["<mask>"] == 9
    # a line without its count: fairseq refuses the file; so do we, naming the line (it was dropped before)
    bad = _fairseq_tokenizer(tmp_path / "nocount", DICT[:2] + ["2"] + DICT[3:])
    with pytest.raises(CheckpointError, match=r"dict.txt:3: expected '<token> <count>"):
        bart_tokenizer.bart_vocab(bad)
    with pytest.raises(CheckpointError, match=r"dict.txt:2: the count 'x' of '1' is not an integer"):
        bart_tokenizer.bart_vocab(_fairseq_tokenizer(tmp_path / "notint", ["0 1", "1 x"]))
    with pytest.raises(CheckpointError, match=r"dict.txt:3: '0' is already on line 1"):
        bart_tokenizer.bart_vocab(_fairseq_tokenizer(tmp_path / "dup", ["0 1", "1 1", "0 1"]))
    # fairseq's overwrite flag: the later entry's index wins, every line is an entry
    over, _, size = bart_tokenizer.bart_vocab(_fairseq_tokenizer(tmp_path / "over", ["0 1", "1 1", "0 1 #fairseq:overwrite"]))
    assert over["a"] == 6 and size == 4 + 3 + 1
    with pytest.raises(CheckpointError, match=r"dict.txt:2: '<unk>' is one of fairseq's special symbols"):
        bart_tokenizer.bart_vocab(_fairseq_tokenizer(tmp_path / "special", ["0 1", "<unk> 5"]))


def test_a_cut_dict_txt_is_refused_against_the_checkpoints_embedding(tmp_path):
    """dict.txt missing its last lines: the ids no longer account for the checkpoint's embedding rows."""
    cut = _fairseq_tokenizer(tmp_path / "cut", DICT[:-2])
    rows = 4 + len(DICT) + 1  # what the checkpoint released with the whole dict.txt has
    with pytest.raises(CheckpointError, match=r"dict.txt: 3 entries give 8 ids .* embedding has 10 rows"):
        bart_tokenizer.write_library_tokenizer(cut, tmp_path / "vocab", embedding_rows=rows)
    assert not (tmp_path / "vocab").exists()
    bart_tokenizer.write_library_tokenizer(_fairseq_tokenizer(tmp_path / "whole", DICT), tmp_path / "vocab",
                                           embedding_rows=rows)
    assert (tmp_path / "vocab" / "tokenizer.json").is_file()
    # a model fine-tuned with another fairseq task may have dropped <mask>: one row fewer is its dictionary too
    bart_tokenizer.write_library_tokenizer(_fairseq_tokenizer(tmp_path / "whole", DICT), tmp_path / "vocab2",
                                           embedding_rows=rows - 1)


@pytest.mark.parametrize("header", ["ID\tTEXT\tTITLE", " id \t Text\ttitle ", "Id\ttext"])
def test_a_tsv_corpus_header_in_any_case_is_the_header(tmp_path, header):
    n = header.count("\t") + 1
    rows = ["d1\tfirst text\tT1", "d2\tsecond text\tT2"] if n == 3 else ["d1\tfirst text", "d2\tsecond text"]
    path = tmp_path / "corpus.tsv"
    path.write_text("\n".join([header, *rows]) + "\n")
    corpus = read_corpus(path)
    assert list(corpus.doc_ids) == ["d1", "d2"]  # the header is not a document


def test_a_tsv_header_this_reader_does_not_know_is_refused(tmp_path):
    path = tmp_path / "corpus.tsv"
    path.write_text("docid\ttext\ttitle\nd1\tfirst\tT\n")
    with pytest.raises(DataError, match=r"corpus.tsv:1: .* looks like a header .* expected id<TAB>text<TAB>title"):
        read_corpus(path)


# -- 3. one message ------------------------------------------------------------------------------------------

_ORBAX_WORKER = compile("def worker(fail):\n    fail()\n", "/site-packages/orbax/checkpoint/_src/fake_worker.py", "exec")


def test_a_full_disk_inside_orbaxs_save_is_one_message_and_leaves_no_partial_checkpoint(tmp_path, monkeypatch,
                                                                                          caplog):
    """orbax's worker threads log the error with its traceback through absl (whose records name absl's own file
    as their call site), leave `<step>.orbax-checkpoint-tmp`, then the save raises: one message remains."""
    from absl import logging as absl_logging

    from gr_jax.training import trainer

    manager = trainer._checkpoint_manager(tmp_path, keep=2)
    scope: dict = {}
    exec(_ORBAX_WORKER, scope)

    def save(step, args=None, force=False):
        (Path(manager.directory) / f"{step}.orbax-checkpoint-tmp-1234").mkdir()

        def fail():
            raise ValueError("RESOURCE_EXHAUSTED: Failed to write 185801 bytes: No space left on device "
                             "[os_error_code='28']")

        def run():
            try:
                scope["worker"](fail)
            except ValueError as e:
                absl_logging.exception("_SignalingThread.run() raised an exception: %s", e)

        t = threading.Thread(target=run)
        t.start()
        t.join()
        raise ValueError("RESOURCE_EXHAUSTED: No space left on device [os_error_code='28']")

    monkeypatch.setattr(manager, "save", save)
    with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, logger="gr_jax.runtime.io_utils"):
        with pytest.raises(OSError) as got:
            trainer.save_checkpoint(manager, 20, {"x": np.zeros(3, np.float32)})
    assert got.value.errno == errno.ENOSPC and "saving checkpoint 20" in str(got.value)
    shown = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert shown == []  # the worker's traceback went to the debug log
    assert any("orbax worker" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
    assert not list(Path(manager.directory).glob("*.orbax-checkpoint-tmp*"))


def test_a_test_cache_setting_that_cannot_be_used_names_the_setting(tmp_path):
    from tests import conftest

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    problem = conftest.cache_setting_problem(str(a_file / "jax"), {conftest.CACHE_ROOT_VARIABLE: str(a_file)})
    assert problem.startswith(f"GR_JAX_TEST_CACHE_DIR='{a_file}'") and "Not a directory" in problem
    assert conftest.cache_setting_problem(str(tmp_path / "fine"), {}) is None


@pytest.mark.slow
def test_pytest_with_a_bad_test_cache_setting_exits_2_with_one_line(tmp_path):
    import os
    import subprocess
    import sys

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env[ "GR_JAX_TEST_CACHE_DIR"] = str(a_file)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n0",
                           "tests/docids/test_vector_cache.py"], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    text = (proc.stdout + proc.stderr).strip()
    assert "Traceback" not in text and "ImportError" not in text
    assert "GR_JAX_TEST_CACHE_DIR=" in text and str(a_file) in text


# -- 4. messages ---------------------------------------------------------------------------------------------

def _evil(path: Path) -> Path:
    torch = require("torch")
    import os

    class Evil:
        def __reduce__(self):
            return os.system, ("echo never",)

    torch.save({"model": {"encoder.embed_tokens.weight": torch.zeros(2, 2)}, "x": Evil()}, path)
    return path


def test_a_checkpoint_that_pickles_os_system_is_refused_naming_it(tmp_path):
    from gr_jax.backbones import bart_convert, t5_convert
    from gr_jax.methods.nci import released as nci_released

    evil = _evil(tmp_path / "checkpoint_best.pt")
    name = f"{__import__('os').system.__module__}.system"  # posix.system here
    with pytest.raises(CheckpointError, match=rf"refused: it pickles the global {name}\b"):
        bart_convert.read_fairseq(evil)
    with pytest.raises(CheckpointError, match=rf"the global {name}\b"):
        bart_convert.fairseq_embedding_rows(evil)
    with pytest.raises(CheckpointError, match=rf"the global {name}\b"):
        t5_convert._read_torch_bin(evil)
    nci = evil.rename(tmp_path / "NCI_NQ.ckpt")
    with pytest.raises(ValueError, match=rf"the global {name}\b"):
        nci_released._read(str(nci), (0,))


def test_the_embedding_rows_of_a_legacy_format_fairseq_checkpoint(tmp_path):
    torch = require("torch")
    from gr_jax.backbones import bart_convert

    for zipped in (True, False):
        path = tmp_path / f"checkpoint_{zipped}.pt"
        torch.save({"model": {"encoder.embed_tokens.weight": torch.zeros(10, 4)}}, path,
                   _use_new_zipfile_serialization=zipped)
        assert bart_convert.fairseq_embedding_rows(path) == 10


def test_a_cut_seal_fixture_names_the_file_and_line(tmp_path):
    from gr_jax.methods.seal import parity
    from gr_jax.runtime.io_utils import FileFormatError

    src = Path(__file__).resolve().parents[1] / "fixtures" / "seal_parity" / "d300_v204"
    folder = tmp_path / "seal_parity"
    folder.mkdir()
    text = (src / "fm_index.json").read_text()
    (folder / "fm_index.json").write_text(text[: len(text) // 2])
    (folder / "scoring.json").write_text((src / "scoring.json").read_text())
    with pytest.raises(FileFormatError, match=r"fm_index.json: line 1 column \d+"):
        parity.check_fixture(folder)


def test_a_bart_checkpoint_that_does_not_match_names_bartconfig_on_its_first_line():
    from gr_jax.backbones import bart_convert
    from gr_jax.backbones.bart import BartConfig

    config = BartConfig(vocab_size=16, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
                        max_position_embeddings=8)
    with pytest.raises(CheckpointMismatchError) as got:
        bart_convert.params_from_hf({"model.shared.weight": np.zeros((16, 8), np.float32)}, config, "ckpt.bin")
    first = str(got.value).splitlines()[0]
    assert "does not match the BartConfig:" in first and "missing" in first and "e.g. " in first


# -- 5. before any work --------------------------------------------------------------------------------------

def test_a_bad_scorer_name_is_refused_when_gin_binds_it():
    import gin

    gin.clear_config()
    try:
        with pytest.raises(gin_utils.GinConfigError, match=r"SealSearch.scorer must be one of 'device', 'host', "
                                                           r"got 'gpu'"):
            gin_utils.parse(["experiments/demo/seal.gin"], ["MODEL_DIR = 'x'", "SealSearch.scorer = 'gpu'"])
    finally:
        gin.clear_config()
    with pytest.raises(gin_utils.GinConfigError, match="got 'gpu'"):  # a parent command's bindings for its children
        gin_utils.check_binding_values(["SealSearch.scorer='gpu'"])


def test_a_malformed_answers_file_is_refused_before_any_child_runs(tmp_path, monkeypatch):
    from gr_jax.protocols import released
    from gr_jax.runtime.io_utils import FileFormatError

    rdir = tmp_path / "release"
    for rel in ("SEAL.NQ/checkpoint_best.pt", "nq/answers.test.tsv"):
        (rdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (rdir / rel).write_text("x\n")
    (rdir / "nq" / "answers.test.tsv").write_text('q1\t["an answer"]\nq2\tnot a list\n')
    ran = []
    monkeypatch.setattr(released, "_run", lambda argv, log_path: ran.append(argv) or (0, ""))
    with pytest.raises(FileFormatError, match=r"answers.test.tsv:2: the answers must be a JSON list"):
        released.reproduce_released("seal", str(rdir), str(tmp_path / "out"), only=["SEAL"])
    assert ran == [] and not (tmp_path / "out").exists()
    with pytest.raises(gin_utils.GinConfigError, match="SealSearch.scorer"):
        released.reproduce_released("seal", str(rdir), str(tmp_path / "out"), only=["SEAL"],
                                    bindings=["SealSearch.scorer='gpu'"])
    assert ran == [] and not (tmp_path / "out").exists()


def _tree(folder: Path):
    if not folder.exists():
        return None
    return sorted((str(p.relative_to(folder)), hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "")
                  for p in folder.rglob("*"))


# every command with a DATA_DIR that is not a folder: (module, gin flags beside MODEL_DIR and DATA_DIR)
PAG_MACROS = ["--gin.SEQUENTIAL_DOCIDS='x'", "--gin.SET_DOCIDS='x'", "--gin.VOCABULARY='x'",
              "--gin.INITIAL_CHECKPOINT_PATH='x'"]
COMMANDS = {
    "train": ["--gin_file=experiments/nq320k/dsi_atomic.gin", "--gin.VOCABULARY='x'"],
    "infer": ["--gin_file=experiments/nq320k/dsi_atomic.gin", "--gin_file=runs/infer.gin", "--gin.VOCABULARY='x'"],
    "dynamic": ["--gin_file=experiments/nq320k/dynamic_bm25.gin"],
    "fewshot": ["--gin_file=experiments/nq320k/fewshot.gin"],
    "robustness": ["--gin_file=experiments/msmarco/robustness_pag.gin", *PAG_MACROS],
    "cross_lingual": ["--gin_file=experiments/msmarco/cross_lingual_pag.gin", *PAG_MACROS,
                      "--gin.MMARCO_TRANSLATIONS={}", "--gin.ALIGNED_DIRS={}", "--gin.CROSS_LINGUAL_QUERIES={}"],
    "align_planner": ["--gin_file=experiments/msmarco/pag.gin", "--gin_file=runs/align_planner.gin", *PAG_MACROS],
}


@pytest.mark.slow  # runs each command's main (in-process)
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_refused_for_a_bad_data_dir_leaves_model_dir_as_it_was(tmp_path, name, capsys, monkeypatch):
    import importlib

    import gin

    # as a user runs them: the protocols keep compiled programs in MODEL_DIR/xla_cache unless this names a folder
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)

    bad = tmp_path / "not_a_folder"
    bad.write_text("a file\n")
    for kind in ("missing", "existing"):
        model_dir = tmp_path / kind
        if kind == "existing":
            model_dir.mkdir()
            (model_dir / "mine.txt").write_text("mine\n")
        before = _tree(model_dir)
        gin.clear_config()
        try:
            rc = importlib.import_module(f"gr_jax.{name}").main(
                [*COMMANDS[name], f"--gin.DATA_DIR='{bad}'", f"--gin.MODEL_DIR='{model_dir}'"])
        finally:
            gin.clear_config()
        err = capsys.readouterr().err
        assert rc == 2, err
        assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: ")
        assert _tree(model_dir) == before, f"{name} wrote into MODEL_DIR before refusing: {err}"


# -- 1. reused state -----------------------------------------------------------------------------------------

def test_an_edited_docid_scheme_state_is_refused_naming_it(tmp_path):
    from gr_jax.data.readers import Corpus
    from gr_jax.docids.atomic import AtomicDocids
    from gr_jax.docids.base import load_scheme_state, save_scheme

    corpus = Corpus(["a", "b", "c"], ["x y", "y z", "z x"])
    scheme = AtomicDocids()
    scheme.text_vocab_size, scheme.doc_ids = 100, ["a", "b", "c"]  # as fit with a 100-id text vocabulary
    built = {"corpus": corpus.fingerprint()}
    save_scheme(scheme, tmp_path / "docid_scheme", built)
    load_scheme_state(AtomicDocids(), tmp_path / "docid_scheme", built)  # intact: loads
    meta = json.loads((tmp_path / "docid_scheme" / "scheme.json").read_text())
    edited = {k: (list(reversed(v)) if isinstance(v, list) and len(v) > 1 else v) for k, v in meta.items()}
    assert edited != meta  # the recipe (built_from) still matches; only the content changed
    (tmp_path / "docid_scheme" / "scheme.json").write_text(json.dumps(edited))
    with pytest.raises(ValueError, match=r"docid_scheme: the saved docid scheme is not the state that was written"):
        load_scheme_state(AtomicDocids(), tmp_path / "docid_scheme", built)
    stripped = {k: v for k, v in meta.items() if k != "content_digest"}  # the digest itself removed
    (tmp_path / "docid_scheme" / "scheme.json").write_text(json.dumps(stripped))
    with pytest.raises(ValueError, match=r"lost its content digest"):
        load_scheme_state(AtomicDocids(), tmp_path / "docid_scheme", built)
