"""Reliability, one test per class of failure a hostile user found (issue: nothing lost, nothing silently
wrong, one writer at a time): integrity of checkpoints and saved files, strict JSON, ranges declared where a
setting is declared, errors that name the file, modes that follow the umask, progress lines in log files,
locks. The kill -9 / full-disk / two-process runs of whole commands are in test_faults.py."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gin
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from gr_jax.runtime import gin_utils, io_utils, locks, progress, provenance, validation
from gr_jax.training import trainer
from tests.conftest import run_tool
from tests.shared import copy_of
from tests.test_bad_inputs import TINY, _main

ROOT = Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------------------------------------------------
# checkpoints: checksums and finite parameters
# ----------------------------------------------------------------------------------------------------------


def _state(value: float) -> dict:
    return {"step": jnp.zeros((), jnp.int32), "params": {"w": jnp.full((3, 2), value, jnp.float32)},
            "nonfinite": jnp.zeros((), jnp.int32)}


def _manager(d: Path) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(d.absolute(), options=ocp.CheckpointManagerOptions(create=True))


def test_a_changed_array_is_caught_by_its_checksum(tmp_path):
    """A flipped bit is a finite number: only the checksum recorded at save can tell. The forged checkpoint
    holds other values than the ones its checksums were computed from (what a bit flip on disk amounts to)."""
    m = _manager(tmp_path / "c")
    trainer.save_checkpoint(m, 1, _state(1.0))
    assert trainer.read_checkpoint(m, 1, "c/1")["state"]["params"]["w"].tolist() == [[1.0] * 2] * 3
    m.save(2, args=ocp.args.Composite(state=ocp.args.StandardSave(_state(1.0 + 2 ** -20)),
                                      digests=ocp.args.JsonSave(trainer.array_digests(_state(1.0)))), force=True)
    m.wait_until_finished()
    with pytest.raises(trainer.DamagedCheckpoint, match=r"c/2: damaged, 1 array\(s\) differ .*params/w"):
        trainer.read_checkpoint(m, 2, "c/2")


def test_nonfinite_parameters_are_refused_and_training_falls_back(tmp_path):
    m = _manager(tmp_path / "checkpoints")
    trainer.save_checkpoint(m, 1, _state(0.5), meta={}, data={})
    trainer.save_checkpoint(m, 2, _state(float("nan")), meta={}, data={})  # checksums agree: the values are wrong
    with pytest.raises(trainer.DamagedCheckpoint, match="NaN or infinite values .*params/w"):
        trainer.read_checkpoint(m, 2, "checkpoints/2")
    template = {k: ocp.utils.to_shape_dtype_struct(v) for k, v in _state(0.0).items()
                if k != "params"} | {"params": {"w": ocp.utils.to_shape_dtype_struct(_state(0.0)["params"]["w"])}}
    _, step, restored = trainer.restore_latest_intact(tmp_path, 3, template, meta={})
    assert step == 1 and float(restored["state"]["params"]["w"][0, 0]) == 0.5
    assert (tmp_path / "damaged_checkpoints" / "2").is_dir()  # set aside, never deleted


def _template() -> dict:
    return jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, _state(0.0))


@pytest.mark.parametrize("damage", ["cut in half", "emptied", "deleted"])
def test_a_damaged_checksum_record_is_damage_not_an_older_checkpoint(tmp_path, damage, caplog):
    """Cutting the checksum file used to switch the check off (read as a checkpoint from before checksums, its
    arrays unchecked): now the checkpoint is set aside and training falls back to the last intact one."""
    m = _manager(tmp_path / "checkpoints")
    trainer.save_checkpoint(m, 1, _state(0.5), meta={}, data={})
    trainer.save_checkpoint(m, 2, _state(0.25), meta={}, data={})
    record = tmp_path / "checkpoints" / "2" / "digests" / "metadata"
    text = record.read_text()
    assert len(text) > 40  # a real record to damage
    if damage == "deleted":
        import shutil

        shutil.rmtree(record.parent)
    else:
        record.write_text(text[: len(text) // 2] if damage == "cut in half" else "")
    with pytest.raises(trainer.DamagedCheckpoint, match=r"checkpoints/2: damaged, its checksum record cannot be read"):
        trainer.read_checkpoint(m, 2, tmp_path / "checkpoints" / "2")
    with caplog.at_level(logging.WARNING):
        _, step, restored = trainer.restore_latest_intact(tmp_path, 3, _template(), meta={})
    assert step == 1 and float(restored["state"]["params"]["w"][0, 0]) == 0.5
    assert (tmp_path / "damaged_checkpoints" / "2").is_dir()
    assert "checksum record" in caplog.text


def test_only_a_checkpoint_from_before_checksums_is_read_unchecked(tmp_path, caplog):
    """Written as checkpoints were before checksums existed (no `digests`, no `format` item in orbax's list of
    items): read, with a note that says it is unchecked."""
    m = _manager(tmp_path / "c")
    m.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(_state(2.0)), meta=ocp.args.JsonSave({})),
           force=True)
    m.wait_until_finished()
    with caplog.at_level(logging.INFO, logger="gr_jax.training.run_state"):
        got = trainer.read_checkpoint(m, 3, "c/3")
    assert float(got["state"]["params"]["w"][0, 0]) == 2.0
    assert "written before checksums were recorded" in caplog.text and "unchecked" in caplog.text
    # the same checkpoint with its format item present but its checksums gone: damaged
    m.save(4, args=ocp.args.Composite(state=ocp.args.StandardSave(_state(2.0)),
                                      format=ocp.args.JsonSave(trainer.CHECKPOINT_FORMAT)), force=True)
    m.wait_until_finished()
    with pytest.raises(trainer.DamagedCheckpoint, match="checksum record cannot be read"):
        trainer.read_checkpoint(m, 4, "c/4")


def test_a_nan_right_after_a_resume_names_the_checkpoint_it_came_from(tmp_path):
    """Not the learning rate first, and not that checkpoint as 'the last one saved before it'."""
    msg = trainer._nonfinite_message(tmp_path, 51, 60, [50], None, resumed_from=50)
    assert f"the first steps after resuming from {tmp_path / 'checkpoints' / '50'}" in msg
    assert "last checkpoint saved before it" not in msg
    later = trainer._nonfinite_message(tmp_path, 91, 100, [50, 80], None, resumed_from=50)
    assert "after resuming" not in later and str(tmp_path / "checkpoints" / "80") in later


def test_a_converted_checkpoint_carries_checksums(tmp_path, caplog):
    """HF / t5x → ours (`t5_convert.save_checkpoint`): a changed array is refused; a directory of the format from
    before checksums (v1) reads with a note; a v2 directory without its checksums is refused."""
    from gr_jax.backbones import t5, t5_convert

    config = t5.T5Config(vocab_size=32, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_decoder_layers=1, num_heads=2)
    params = jax.tree_util.tree_map(np.asarray, t5.init_params(config, seed=0))
    out = t5_convert.save_checkpoint(params, config, tmp_path / "ours")
    meta = json.loads((out / "config.json").read_text())
    assert meta["format"] == t5_convert.FORMAT_TAG and len(meta["checksums"]) == len(jax.tree_util.tree_leaves(params))
    t5_convert.load_checkpoint(out)
    key = sorted(meta["checksums"])[0]
    forged = dict(meta, checksums={**meta["checksums"], key: "0" * 24})  # what a flipped bit on disk amounts to
    (out / "config.json").write_text(json.dumps(forged))
    with pytest.raises(t5_convert.CheckpointError, match=f"damaged, 1 array\\(s\\) differ .*first: {key}"):
        t5_convert.load_checkpoint(out)
    (out / "config.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "checksums"}))
    with pytest.raises(t5_convert.CheckpointError, match="without a readable 'checksums' record"):
        t5_convert.load_checkpoint(out)
    (out / "config.json").write_text(json.dumps({"format": "gr_jax.t5.v1", "t5_config": meta["t5_config"]}))
    with caplog.at_level(logging.INFO, logger="gr_jax.backbones.t5_convert"):
        t5_convert.load_checkpoint(out)
    assert "read unchecked" in caplog.text
    import shutil

    shutil.move(out / "params" / "_METADATA", tmp_path / "_METADATA")
    with pytest.raises(t5_convert.CheckpointError, match="_METADATA is missing"):
        t5_convert.load_checkpoint(out)


def test_array_digests_do_not_depend_on_the_tree_type():
    """orbax restores named tuples and tuples as dicts and lists when no template is given."""
    import collections

    T = collections.namedtuple("T", "count mu")
    a = {"opt": (T(np.int32(1), np.ones(2, np.float32)),)}
    b = {"opt": [{"count": np.int32(1), "mu": np.ones(2, np.float32)}]}
    assert trainer.array_digests(a) == trainer.array_digests(b)
    b["opt"][0]["mu"] = np.array([1.0, 1.0 + 2 ** -23], np.float32)
    assert trainer.array_digests(a) != trainer.array_digests(b)


# ----------------------------------------------------------------------------------------------------------
# saved files: their rows, not only their settings
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["edit", "delete", "cut at a line break", "cut mid-line", "empty"])
def test_saved_records_are_checked_against_their_digest(tmp_path, damage):
    path = tmp_path / "variations.jsonl"
    rows = [{"qid": str(i), "text": f"query {i}"} for i in range(3)]
    io_utils.write_text(path, provenance.records_text({"built_from": {"seed": 1}, "stats": {}}, rows))
    head, got = provenance.read_records(path, "query-variation file")
    assert got == rows and head["built_from"] == {"seed": 1} and head["rows"] == 3
    lines = path.read_text().splitlines(keepends=True)
    broken = {"edit": "".join(lines[:2] + [lines[2].replace("query 1", "query 7")] + lines[3:]),
              "delete": "".join(lines[:2] + lines[3:]),
              "cut at a line break": "".join(lines[:3]),
              "cut mid-line": "".join(lines[:3]) + lines[3][:9],
              "empty": ""}[damage]
    path.write_text(broken)
    with pytest.raises(ValueError, match=f"{path}.*(delete it to build it again)"):
        provenance.read_records(path, "query-variation file")


# ----------------------------------------------------------------------------------------------------------
# strict JSON, files named in errors, byte-order marks
# ----------------------------------------------------------------------------------------------------------


def test_json_is_strict():
    text = io_utils.json_text({"a": float("nan"), "b": [np.float32("inf"), 1.5], "c": np.int64(3)})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c)) == {"a": None, "b": [None, 1.5], "c": 3}


def test_decode_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "meta.json"
    bad.write_text('{"a": 1,\n "b": [1, 2')
    with pytest.raises(io_utils.FileFormatError, match=f"{bad}: line 2 column"):
        io_utils.read_json(bad)
    latin = tmp_path / "x.gin"
    latin.write_bytes(b"A = 1\nB = 'caf\xe9'\n")
    with pytest.raises(io_utils.FileFormatError, match=f"{latin}: not UTF-8 .*line 2"):
        io_utils.read_text(latin)
    npz = tmp_path / "inputs.npz"
    np.savez(npz, a=np.arange(100))
    npz.write_bytes(npz.read_bytes()[:50])
    with pytest.raises(io_utils.FileFormatError, match=f"{npz}: not a readable .npz"):
        io_utils.load_npz(npz)


def test_a_byte_order_mark_is_not_part_of_the_first_id(tmp_path):
    from gr_jax.data.readers import read_corpus, read_msmarco_collection
    from gr_jax.data.trec import read_qrels

    (tmp_path / "collection.tsv").write_bytes(b"\xef\xbb\xbf1\tfirst passage\n2\tsecond passage\n")
    assert list(read_msmarco_collection(tmp_path / "collection.tsv").doc_ids) == ["1", "2"]
    (tmp_path / "corpus.tsv").write_bytes(b"\xef\xbb\xbfd1\tone\nd2\ttwo\n")
    assert list(read_corpus(tmp_path / "corpus.tsv").doc_ids) == ["d1", "d2"]
    (tmp_path / "qrels.tsv").write_bytes(b"\xef\xbb\xbfq1\t0\t1\t1\n")
    assert list(read_qrels(tmp_path / "qrels.tsv")) == ["q1"]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["file", "flag", "included file", "not utf-8"])
def test_gin_syntax_errors_name_the_file_or_flag(tmp_path, capsys, where):
    from gr_jax import train

    broken = tmp_path / "broken.gin"
    broken.write_text(TINY + "TRAIN_STEPS = [2\n")  # a bracket never closed, at the end of the file
    exp = tmp_path / "exp.gin"
    argv = [f"--gin.MODEL_DIR='{tmp_path / 'm'}'"]
    if where == "file":
        argv.append(f"--gin_file={broken}")
    elif where == "included file":
        exp.write_text(f"include '{broken}'\n")
        argv.append(f"--gin_file={exp}")
    elif where == "not utf-8":
        exp.write_bytes(TINY.encode() + b"# caf\xe9\n")
        argv.append(f"--gin_file={exp}")
    else:
        exp.write_text(TINY)
        argv += [f"--gin_file={exp}", "--gin.TRAIN_STEPS=[2"]
    rc, err = _main(train, argv, capsys)
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, err
    named = {"file": str(broken), "included file": str(broken), "not utf-8": str(exp), "flag": "'TRAIN_STEPS = [2'"}
    assert named[where] in err, err
    assert not (tmp_path / "m").exists()  # a refused command writes nothing


# ----------------------------------------------------------------------------------------------------------
# ranges declared where the setting is declared
# ----------------------------------------------------------------------------------------------------------


def test_every_numeric_setting_has_a_range():
    """What is not annotated with a range gets its type's (int ≥ 0, float finite): a parameter with a numeric
    default whose annotation yields no range would go unchecked; the ones here take strings too, on purpose."""
    gin_utils.register_configurables()
    unchecked, seen = [], set()
    for selector, c in gin.config._REGISTRY.items():
        if not selector.startswith("gr_jax") or id(c) in seen:
            continue
        seen.add(id(c))
        hints = validation.annotations_of(c.wrapped)
        import inspect

        for p in inspect.signature(c.wrapped).parameters.values():
            numeric = isinstance(p.default, (int, float)) and not isinstance(p.default, bool)
            if numeric and validation.range_of(hints.get(p.name))[0] is None:
                unchecked.append(f"{c.name}.{p.name}")
    # relevance thresholds: an int, or a dict per split
    assert sorted(unchecked) == ["EvalConfig.rel_threshold", "run_robustness.rel_threshold"], unchecked


def test_keyword_arguments_of_a_configurable_have_ranges_too():
    """`**overrides` (the model configs' get_config, a retriever's keywords passed on to its base) were bound
    unchecked: `t5.get_config.dropout_rate = 1.5` trained with exit 0 and a gradient norm of 0. Each configurable
    that takes `**kwargs` must resolve them to declared parameters (a base's `__init__`, or `keyword_fields`)."""
    import inspect

    gin_utils.register_configurables()
    unresolved, seen = [], set()
    for selector, c in gin.config._REGISTRY.items():
        if id(c) in seen or selector.startswith("gin."):
            continue
        seen.add(id(c))
        params = inspect.signature(c.wrapped).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            continue
        if not set(validation.annotations_of(c.wrapped)) - set(params):
            unresolved.append(selector)
    assert unresolved == [], unresolved
    for binding, message in [("t5.get_config.dropout_rate = 1.5", "t5.get_config.dropout_rate must be"),
                             ("llama.get_config.rms_norm_eps = 0.0", "llama.get_config.rms_norm_eps must be"),
                             ("t5.get_config.num_heads = -2", "t5.get_config.num_heads must be an integer ≥ 1")]:
        gin.clear_config()
        with pytest.raises(gin_utils.GinConfigError, match=message.replace(".", r"\.")):
            gin_utils.parse([], [binding])
    # and however a config is made (a saved config.json, code)
    from gr_jax.backbones import t5

    with pytest.raises(ValueError, match=r"T5Config.dropout_rate must be < 1"):
        t5.T5Config(dropout_rate=1.0)
    with pytest.raises(ValueError, match=r"T5Config.layer_norm_epsilon must be a finite number > 0"):
        t5.T5Config.from_dict({**dataclasses.asdict(t5.T5Config()), "layer_norm_epsilon": -1.0})


@pytest.mark.slow
def test_eval_refuses_a_metric_list_that_names_nothing(capsys):
    """`gr_jax.eval --metrics ','` printed an empty table with exit 0: now argparse's usage error, exit 2."""
    from gr_jax import eval as eval_cmd

    with pytest.raises(SystemExit) as e:
        eval_cmd.main(["--run", "r", "--qrels", "q", "--metrics", ","])
    assert e.value.code == 2 and "argument --metrics: ',' names no metric" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        eval_cmd.main(["--run", "r", "--qrels", "q", "--metrics", "Hit@1,,MRR@10"])
    assert "an empty metric between commas" in capsys.readouterr().err


def test_list_arguments_name_something(capsys):
    """The list type of the commands and tools (`cli.name_list`, behind `gr_jax.eval --metrics`, which printed an
    empty table with exit 0 for ','); a malformed fault variable said "not enough values to unpack";
    `bench_train --configs nosuch` ended in a traceback."""
    import argparse

    from gr_jax.runtime import cli
    from gr_jax.evaluation import metrics

    metric_list = cli.name_list(what="metric", parse=lambda m: metrics.Metric.parse(m).name)
    assert metric_list("Hit@1, MRR@10") == ["Hit@1", "MRR@10"]
    for text, message in ((",", "names no metric"), ("", "names no metric"), ("Hit@1,,MRR@10", "an empty metric"),
                          ("Hit@x", "Hit@x")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            metric_list(text)
    rc, _, err = run_tool("bench_train", ["--configs", "tiny,nosuch", "--no_write"], capsys)
    assert rc == 2 and "unknown T5 config ['nosuch']" in err and "Traceback" not in err
    os.environ["GR_JAX_FAULT"] = "checkpoint"
    try:
        with pytest.raises(ValueError, match=r"GR_JAX_FAULT='checkpoint': 'checkpoint' is not <point>:<n ≥ 1>"):
            io_utils.fault_point("checkpoint")
    finally:
        del os.environ["GR_JAX_FAULT"]


@pytest.mark.slow
@pytest.mark.parametrize("binding, message", [
    ("write_pseudo_queries.max_documents = -1998", "write_pseudo_queries.max_documents must be an integer ≥ 0"),
    ("finetune_dual_encoder.temperature = -0.05", "finetune_dual_encoder.temperature must be a finite number > 0"),
    ("PseudoQueryGenerator.temperature = -1.0", "PseudoQueryGenerator.temperature must be a finite number > 0"),
    ("BATCH_SIZE = 0", "BATCH_SIZE (train.batch_size) must be an integer ≥ 1"),
    ("make_optimizer.learning_rate = 1e999", "make_optimizer.learning_rate must be a finite number > 0"),
])
def test_out_of_range_bindings_are_refused_before_anything_runs(tmp_path, capsys, binding, message):
    from gr_jax import train

    exp = tmp_path / "exp.gin"
    exp.write_text(TINY + "import gr_jax.protocols.lm_pseudo_queries\n")
    name, value = (x.strip() for x in binding.split("="))
    rc, err = _main(train, [f"--gin_file={exp}", f"--gin.MODEL_DIR='{tmp_path / 'm'}'", f"--gin.{name}={value}"],
                    capsys)
    assert rc == 2 and message in err, err
    assert not (tmp_path / "m").exists()


# ----------------------------------------------------------------------------------------------------------
# side effects: modes, progress in log files, a refused run writes nothing
# ----------------------------------------------------------------------------------------------------------


def test_outputs_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        io_utils.write_text(tmp_path / "a" / "run.txt", "x")
        with io_utils.atomic_dir(tmp_path / "d") as d:
            (d / "f").write_text("y")
    finally:
        os.umask(old)
    assert (tmp_path / "a" / "run.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755


def test_progress_in_a_log_file_is_a_few_lines(caplog):
    with caplog.at_level(logging.INFO, logger="gr_jax.runtime.progress"):
        bar = progress.LogProgress(1000, "train", "step")
        for _ in range(1000):
            bar.update(1)
            bar.set_postfix(loss="1.000")
        bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert 9 <= len(lines) <= 11 and all("\r" not in line for line in lines)
    assert lines[-1].startswith("train: 1000/1000 step (100%)") and "loss=1.000" in lines[-1]


@pytest.mark.slow
def test_a_refused_resume_leaves_config_gin_as_it_was(tiny_dsi, tmp_path, capsys):
    """The run is refused for another docid scheme than its checkpoint's: the config.gin that the message
    tells the user to read is still the one of the checkpoint's run."""
    from gr_jax import train

    exp = tmp_path / "exp.gin"
    exp.write_text(TINY)
    copy_of(tiny_dsi[1], tmp_path / "m")  # TINY trained for two steps
    run = [f"--gin_file={exp}", f"--gin.MODEL_DIR='{tmp_path / 'm'}'"]
    before = (tmp_path / "m" / "config.gin").read_bytes()
    rc, err = _main(train, run + ["--gin.TRAIN_STEPS=4", "--gin.load_dataset.demo_docs=41"], capsys)
    assert rc == 2 and "config.gin" in err, err
    assert (tmp_path / "m" / "config.gin").read_bytes() == before
    assert not list((tmp_path / "m").glob("config.gin.prev-*"))
    assert not (tmp_path / "m" / locks.LOCK_NAME).exists()  # released


# ----------------------------------------------------------------------------------------------------------
# one writer per directory
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_writer_is_refused_and_a_dead_ones_lock_taken_over(tmp_path, caplog):
    d = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from gr_jax.runtime import locks
        with locks.output_lock({str(d)!r}, "gr_jax train"):
            print("held", flush=True)
            sys.stdin.readline()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(locks.LockedError, match=f"{d} is being written by process {holder.pid} on host .*gr_jax train"):
            with locks.output_lock(d, "gr_jax dynamic"):
                pass
    finally:
        holder.communicate("\n", timeout=60)
    d.mkdir(exist_ok=True)  # the holder removed it: it wrote nothing there
    (d / locks.LOCK_NAME).write_text(json.dumps({"pid": 2 ** 22 + 7, "host": "h", "command": "gr_jax train",
                                                 "started": 0}))
    with caplog.at_level(logging.WARNING, logger="gr_jax.runtime.locks"):
        with locks.output_lock(d, "gr_jax train"):
            held = json.loads((d / locks.LOCK_NAME).read_text())
            assert held["pid"] == os.getpid()
    assert "took over the lock that process 4194311 on host h" in caplog.text
    assert not (d / locks.LOCK_NAME).exists()


def test_a_lock_on_a_new_directory_leaves_nothing_when_nothing_was_written(tmp_path):
    with locks.output_lock(tmp_path / "new" / "run", "gr_jax train"):
        pass
    assert not (tmp_path / "new" / "run").exists()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(io_utils.FileFormatError, match="afile is a file, not a directory"):
        with locks.output_lock(tmp_path / "afile" / "sub", "gr_jax train"):
            pass


def _tree(folder: Path) -> dict:
    """Every file under `folder` → its bytes' digest: what 'byte-identical' compares."""
    return {str(p.relative_to(folder)): provenance.file_digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(files, bindings, fn, where: Path, match: str) -> None:
    """`fn` configured by `files` + `bindings`, under the output lock its command takes, refused with `match`."""
    gin.clear_config()
    gin_utils.parse([str(f) for f in files], bindings)
    try:
        with pytest.raises(ValueError, match=match):
            with locks.output_lock(where, "gr_jax test"):
                gin_utils.call_configured(fn)
    finally:
        gin.clear_config()


def test_a_refused_training_leaves_the_directory_as_it_found_it(tiny_dsi, tmp_path):
    """A training refused after preparing used to leave vocabulary/ and docid_scheme/ behind in a new MODEL_DIR
    (they are provisional until the run is accepted); in a MODEL_DIR that holds a run, nothing changes, byte for
    byte, config.gin included."""
    from gr_jax import compose

    exp, shared = tiny_dsi
    new = tmp_path / "new" / "run"
    _refused([exp], [f"MODEL_DIR = '{new}'", "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 1}"], compose.train,
             new, "shorter than the longest docid")
    assert not (tmp_path / "new").exists()
    held = copy_of(shared, tmp_path / "held")
    before = _tree(held)
    _refused([exp], [f"MODEL_DIR = '{held}'", "load_dataset.demo_docs = 30", "make_optimizer.learning_rate = 0.5"],
             compose.train, held, "vocabulary")
    assert _tree(held) == before


def test_a_refused_pseudo_query_rerun_keeps_its_config_gin(tiny_hf_llama, tmp_path):
    """The refused re-run rewrote config.gin before refusing, then pointed at "the config.gin beside it"."""
    from gr_jax.protocols import lm_pseudo_queries

    run = tmp_path / "run"
    bindings = [f"MODEL_DIR = '{run}'", f"LM = '{tiny_hf_llama}'", "write_pseudo_queries.max_documents = 2",
                "write_pseudo_queries.num_queries = 1", "PseudoQueryGenerator.max_query_tokens = 2"]
    gin.clear_config()
    gin_utils.parse(["experiments/demo/pseudo_queries_smollm2.gin"], bindings)
    with locks.output_lock(run, "gr_jax test"):
        gin_utils.call_configured(lm_pseudo_queries.write_pseudo_queries)
    gin.clear_config()
    before = _tree(run)
    assert "config.gin" in before
    _refused(["experiments/demo/pseudo_queries_smollm2.gin"], [*bindings, "write_pseudo_queries.seed = 7"],
             lm_pseudo_queries.write_pseudo_queries, run, "built with another seed")
    assert _tree(run) == before


def test_a_full_disk_at_lock_time_leaves_no_lock_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GR_JAX_FAULT", "lock:1:enospc")
    with pytest.raises(OSError, match=f"no space left on the device to write the lock file {tmp_path / 'new'}/"
                                      r"\.gr_jax\.lock \(.* free there\)"):
        with locks.output_lock(tmp_path / "new", "gr_jax train"):
            pass
    assert list(tmp_path.iterdir()) == []  # no lock file, and the folder it made is gone


def test_a_path_is_a_place_not_a_spelling(tiny_dsi, tmp_path, monkeypatch):
    """The same infer with MODEL_DIR spelt absolute, then relative: the second run's results are the first's
    (no `.prev-1` kept, no "different result" warning), as MODEL_DIR is resolved once, when the flags are
    parsed."""
    from gr_jax import compose

    exp, shared = tiny_dsi
    model = copy_of(shared, tmp_path / "m")
    for spelling in (str(model), "./m/../m"):
        gin.clear_config()
        gin_utils.parse([str(exp), "runs/eval.gin"], [f"MODEL_DIR = '{spelling}'", "NUM_BEAMS = 3"])
        assert gin.query_parameter("MODEL_DIR/macro.value") == str(model)
        gin_utils.call_configured(compose.infer)
        gin.clear_config()
        monkeypatch.chdir(tmp_path)
    kept = sorted(p.name for p in model.rglob("*.prev-*"))
    assert kept == [], kept


def test_messages_name_what_is_wrong(tmp_path, monkeypatch):
    """Three messages that misled: a parameter bound directly instead of through the library's macro was refused
    as "SEED: nothing uses it"; an empty corpus file surfaced as a qrels error; a missing include did not name
    the file that includes it."""
    gin_utils.parse(["experiments/demo/dsi_atomic.gin"], ["MODEL_DIR = 'm'", "train.seed = 1"])
    assert gin.query_parameter("train.seed") == 1  # what the user asked for, accepted
    gin.clear_config()
    with pytest.raises(gin_utils.GinConfigError, match=r"SEED: read by train.seed \(runs/train.gin\), but that "
                                                       r"binding is replaced by yours"):
        gin_utils.parse(["experiments/demo/dsi_atomic.gin"], ["MODEL_DIR = 'm'", "train.seed = 1", "SEED = 3"])
    gin.clear_config()
    from gr_jax.data import readers

    for name in ("corpus.jsonl", "corpus.tsv"):
        (tmp_path / name).write_text("\n")
        with pytest.raises(readers.DataError, match=f"{tmp_path / name}: no documents \\(the file is empty"):
            readers.read_corpus(tmp_path / name)
    (tmp_path / "queries.tsv").write_text("")
    with pytest.raises(readers.DataError, match="queries.tsv: no queries"):
        readers.read_queries(tmp_path / "queries.tsv")
    (tmp_path / "inner.gin").write_text("include 'nosuch/file.gin'\n")
    (tmp_path / "outer.gin").write_text("include 'inner.gin'\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(gin_utils.GinConfigError, match=f"gin file {tmp_path / 'inner.gin'}: one of its includes "
                                                       f"cannot be opened .*nosuch/file.gin"):
        gin_utils.parse(["outer.gin"], [])


def test_a_failed_write_names_the_file_and_the_space_left(tmp_path, monkeypatch):
    """A full disk raises `[Errno 28] No space left on device` with no path (the write of a run file, say): the
    error names the output and the free space there, and nothing is left half-written."""
    import errno

    real = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, _):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: Full(real(fd, *a, **k)))
    out = tmp_path / "runs" / "dev.step2.run"
    with pytest.raises(OSError, match=f"no space left on the device while writing {out} \\(.* MiB free there\\)"):
        io_utils.write_text(out, "q1 Q0 d1 1 0.5 gr_jax\n")
    assert list((tmp_path / "runs").iterdir()) == []
    monkeypatch.undo()
    with pytest.raises(OSError, match=f"cannot write {tmp_path / 'ro'}"):
        with io_utils.atomic_dir(tmp_path / "ro"):
            raise PermissionError(errno.EACCES, "Permission denied")


def test_orbax_worker_tracebacks_go_to_the_debug_log(caplog):
    """A full disk during a checkpoint save printed ~117 lines of orbax worker-thread tracebacks before the one
    message that names the folder: such records (orbax's files, ERROR, a traceback) now reach the debug log only."""
    io_utils.quiet_orbax_threads()
    try:
        raise ValueError("RESOURCE_EXHAUSTED: No space left on device")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("absl", logging.ERROR, f"{os.sep}site-packages{os.sep}orbax{os.sep}checkpoint"
                               f"{os.sep}future.py", 1, "_SignalingThread.run() raised an exception", None, exc_info)
    other = logging.LogRecord("absl", logging.ERROR, f"{os.sep}elsewhere{os.sep}x.py", 1, "kept", None, exc_info)
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("absl").handle(record)
        logging.getLogger("absl").handle(other)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["kept"]
    assert any(r.levelno == logging.DEBUG and "raised an exception" in r.getMessage() for r in caplog.records)


def test_dynamic_report_under_a_file_is_one_message(tmp_path, capsys):
    d = tmp_path / "run" / "dynamic"
    d.mkdir(parents=True)
    from gr_jax.protocols.dynamic_corpora import summarize

    P = [[0.75, float("nan")], [0.5, 0.25]]
    (d / "dynamic.json").write_text(io_utils.json_text({"P": P, "method": "bm25", "idbi": [0.0, 0.1], **summarize(P)}))
    (tmp_path / "afile").write_text("x")
    rc, _, err = run_tool("dynamic_report", [tmp_path / "run", "--out", tmp_path / "afile" / "report"], capsys)
    assert rc == 2 and "afile is a file, not a directory" in err and "Traceback" not in err


def test_tools_validate_their_numeric_arguments(capsys):
    """No tool takes a bare `type=int` / `type=float` (argparse would accept 0 or -5 and fail later with a
    traceback); one of them run with a bad value stops at once."""
    bare = [f"{p.name}: {line.strip()}" for p in sorted((ROOT / "tools").glob("*.py"))
            for line in p.read_text().splitlines() if "add_argument" in line and ("type=int" in line or "type=float" in line)]
    assert not bare, bare
    import argparse

    from gr_jax.runtime import cli

    assert cli.nonnegative("0") == 0.0 and cli.nonnegative("0.25") == 0.25
    for text in ("-0.1", "nan", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.nonnegative(text)
    rc, _, err = run_tool("bench_train", ["--batch", "0"], capsys)
    assert rc == 2 and "--batch: '0': must be an integer ≥ 1" in err and "Traceback" not in err
