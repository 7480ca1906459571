"""One name per setting (`gin_checks.renamed` / `settle_renamed`, run by `gin_utils.parse`): the number of beams,
the evaluation batch size and the split are `EvalConfig`'s in every command; their earlier names (NUM_BEAMS,
EVAL_SPLIT, `infer.num_beams`, `run_robustness.num_beams`, ...) keep working, each logging one line, and two names
of one setting bound to different values are refused with a message naming both. Hand-worked cases on gin alone
(no model is built)."""

from __future__ import annotations

import logging
import re

import gin
import pytest

from gr_jax.runtime import gin_checks, gin_utils
from gr_jax.evaluation.retrieval import EvalConfig, evaluation_settings
from tests.conftest import REPO


@pytest.fixture
def parse(tmp_path):
    """parse(file text, command-line bindings) → the EvalConfig the commands would read."""

    def run(text: str, bindings=()):
        gin.clear_config()
        path = tmp_path / "exp.gin"
        path.write_text(text)
        gin_utils.parse([str(path)], list(bindings))
        return gin_checks.call_configured(EvalConfig)

    yield run
    gin.clear_config()


def _moved(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is an earlier name of" in r.getMessage()]


def test_an_earlier_name_alone_is_read_as_the_setting_and_logs_one_line(parse, caplog):
    caplog.set_level(logging.INFO, logger="gr_jax.runtime.gin_checks")
    cfg = parse("run_robustness.num_beams = 7\nrun_fewshot.split = 'test'\n")
    assert (cfg.num_beams, cfg.split, cfg.batch_size) == (7, "test", 32)  # batch: EvalConfig's default
    assert sorted(_moved(caplog)) == [
        "gin: run_fewshot.split is an earlier name of EvalConfig.split; read as EvalConfig.split = 'test'",
        "gin: run_robustness.num_beams is an earlier name of EvalConfig.num_beams; read as EvalConfig.num_beams = 7"]
    # the earlier binding is gone: nothing reads it twice, and config.gin records the setting's own name
    text = gin.config_str()
    assert "run_robustness.num_beams" not in text and "EvalConfig.num_beams = 7" in text


def test_the_experiments_value_is_used_when_nothing_else_binds_the_setting(parse, caplog):
    """The bug this fixes: runs/infer.gin bound NUM_BEAMS = 10 to infer.num_beams, so glen.gin's
    EvalConfig.num_beams = 100 became 10 under gr_jax.infer without a word."""
    caplog.set_level(logging.INFO, logger="gr_jax.runtime.gin_checks")
    infer_gin = (REPO / "gin_configs" / "runs" / "infer.gin").read_text()
    cfg = parse(infer_gin + "MODEL_DIR = 'm'\nEvalConfig.num_beams = 100\n")
    assert cfg.num_beams == 100 and not _moved(caplog)


def test_two_names_with_different_values_in_the_files_are_refused_naming_both(parse):
    with pytest.raises(gin_checks.GinConfigError) as e:
        parse("EvalConfig.num_beams = 100\nNUM_BEAMS = 10\ninfer.num_beams = %NUM_BEAMS\n")
    message = str(e.value)
    assert "in the gin files" in message
    assert "EvalConfig.num_beams = 100" in message and "NUM_BEAMS = 10" in message
    assert "infer.num_beams = 10" in message  # the binding that reads the macro, with the macro's value
    assert "bind EvalConfig.num_beams once" in message


def test_two_names_with_the_same_value_are_one_setting(parse, caplog):
    caplog.set_level(logging.INFO, logger="gr_jax.runtime.gin_checks")
    cfg = parse("EvalConfig.num_beams = 15\nrun_robustness.num_beams = 15\n")
    assert cfg.num_beams == 15 and len(_moved(caplog)) == 1


def test_the_command_line_replaces_the_files_value_under_either_name(parse, caplog):
    """The README's habit `--gin.EVAL_SPLIT="'test'"` with an experiment that binds EvalConfig.split = 'dev'."""
    caplog.set_level(logging.INFO, logger="gr_jax.runtime.gin_checks")
    cfg = parse("EvalConfig.split = 'dev'\nEvalConfig.num_beams = 100\n", ["EVAL_SPLIT = 'test'", "NUM_BEAMS = 20"])
    assert (cfg.split, cfg.num_beams) == ("test", 20)
    assert len(_moved(caplog)) == 2
    assert any("the command line's value replaces EvalConfig.num_beams = 100" in r.getMessage()
               for r in caplog.records)
    cfg = parse("EvalConfig.num_beams = 100\n", ["EvalConfig.num_beams = 20"])  # the one name: gin's later-wins
    assert cfg.num_beams == 20


def test_a_conflict_on_the_command_line_is_refused_naming_both(parse):
    with pytest.raises(gin_checks.GinConfigError) as e:
        parse("EvalConfig.num_beams = 100\n", ["NUM_BEAMS = 20", "EvalConfig.num_beams = 30"])
    message = str(e.value)
    assert "on the command line" in message and "NUM_BEAMS = 20" in message
    assert "EvalConfig.num_beams = 30" in message and "= 100" not in message  # the file's value is not in it


def test_a_macro_that_only_an_earlier_name_read_is_not_reported_unused(parse):
    """runs/cross_lingual.gin used to bind run_cross_lingual.split = %CROSS_LINGUAL_SPLIT: a user's copy of it
    still parses (the macro is read through the setting now)."""
    cfg = parse("CROSS_LINGUAL_SPLIT = 'dl19'\nrun_cross_lingual.split = %CROSS_LINGUAL_SPLIT\n")
    assert cfg.split == "dl19"


def test_python_callers_replace_the_configured_values(parse):
    parse("EvalConfig.num_beams = 100\nEvalConfig.split = 'dev'\n")
    cfg = evaluation_settings(split="test", batch_size=4)
    assert (cfg.split, cfg.num_beams, cfg.batch_size) == ("test", 100, 4)


def test_every_earlier_name_is_declared_for_a_setting_with_one_name_and_shipped_files_use_the_new_names():
    gin_utils.register_configurables()
    table = gin_checks.renamed_settings()
    assert set(table) >= {"EvalConfig.num_beams", "EvalConfig.split", "EvalConfig.batch_size"}
    earlier = [n for names in table.values() for n in names]
    assert len(earlier) == len(set(earlier))  # one earlier name belongs to one setting
    assert not set(earlier) & set(table)
    # t5x's own dataset config reads EVAL_SPLIT in the t5x run tiers (settled when the t5x model is built)
    allowed = {("gr_jax/t5x/configs/runs/eval/t5x_run.gin", "EVAL_SPLIT"),
               ("gr_jax/t5x/configs/runs/infer/t5x_run.gin", "EVAL_SPLIT")}
    found = []
    for path in sorted([*(REPO / "gin_configs").rglob("*.gin"), *(REPO / "gr_jax").rglob("*.gin"),
                        *(REPO / "tests" / "toy_method").rglob("*.gin")]):
        for line in path.read_text().splitlines():
            m = re.match(r"\s*([\w./]+)\s*=", line)
            lhs = m.group(1).rsplit("/", 1)[-1] if m else ""
            hit = [e for e in earlier if lhs == e or ("." in e and lhs.endswith("." + e))]
            if hit and (path.relative_to(REPO).as_posix(), hit[0]) not in allowed:
                found.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert not found, found
