"""The student's corpus: dialogues no evaluation set uses, split by dialogue, checked and rendered."""

import json

import pytest
from typer.testing import CliRunner

from fastvista.cli import app
from fastvista.loaders import load
from fastvista.protocol import drive
from fastvista.records_io import write_jsonl
from fastvista.schema import Dialogue, Turn
from fastvista.single_pass import parse_output
from fastvista.synth.corpus import build, corpus_report, split_of
from fastvista.synth.pipeline import TeacherConfig, label_dialogue
from tests.scripted import ScriptedBackend
from tests.test_pipeline import museum_dialogue

TC = "tests/fixtures/topical_chat/conversations/valid_freq.json"


def test_a_dialogue_sharing_a_turn_with_an_evaluation_set_stays_out(tmp_path):
    [d] = list(load("topical_chat", TC))
    kept, report = build([TC], [], set(), max_scored_turns=2)
    assert [k.id for k in kept] == [d.id] and len(kept[0].scored_indices()) == 2 and kept[0].meta["split"] == split_of(d.id)
    reused = tmp_path / "eval.jsonl"
    long_turn = next(t.text for t in d.turns if len(t.text) > 40)
    write_jsonl(reused, [Dialogue(id="e", turns=[Turn(role="assistant", text=f"  {long_turn.upper()} ")])])  # case and spaces aside
    kept, report = build([TC], [("jsonl", reused)], set(), max_scored_turns=2)
    assert kept == [] and report["dropped"] == {"shares a turn with an evaluation set": 1}
    kept, report = build([TC], [], {d.id}, max_scored_turns=2)
    assert kept == [] and report["dropped"] == {"demo dialogue": 1}


def test_the_split_is_a_stable_function_of_the_id():
    ids = [f"dialogue-{k}" for k in range(2000)]
    splits = [split_of(i) for i in ids]
    assert splits == [split_of(i) for i in ids]
    assert 0.09 < splits.count("test") / 2000 < 0.15 and 0.05 < splits.count("validation") / 2000 < 0.11


def test_corpus_split_writes_student_files_per_split_and_reports_the_checks(tmp_path):
    scored = []
    for i, split in enumerate(["train", "train", "validation", "test"]):
        d = museum_dialogue(i)
        d.meta = {"split": split}
        scored.append(drive(label_dialogue(d, TeacherConfig()), ScriptedBackend()))
    scored[1].turns[0].errors = ["decompose: 1 unparseable answer(s) before one parsed"]
    scored[0].turns[0].claims[0].text = "The Louvre opened in"  # what a cut answer would leave
    labelled = tmp_path / "labelled.jsonl"
    write_jsonl(labelled, scored)
    result = CliRunner().invoke(app, ["data", "corpus-split", str(labelled), "-o", str(tmp_path / "split"), "--window-turns", "2"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "split/report.json").read_text())
    assert report["examples"] == {"train": 3 + 2, "validation": 3}  # the turn with an error is left out
    windows = [json.loads(l) for l in (tmp_path / "split/train_window.jsonl").read_text().splitlines()]
    assert report["window_examples"]["train"] == len(windows) > 0 and all(e["format"]["turns_per_call"] == 2 for e in windows)
    assert {e["dialogue_id"] for e in windows} <= {"d0", "d1"} and (tmp_path / "split/validation_window.jsonl").exists()
    assert report["by_split"]["train"]["turns_with_errors"] == 1 and report["by_split"]["test"]["scored_turns"] == 3
    assert report["claims_not_ending_a_sentence"] == 1 and "The Louvre opened in" in report["examples_not_ending_a_sentence"][0]
    train = [json.loads(l) for l in (tmp_path / "split/train.jsonl").read_text().splitlines()]
    assert {e["dialogue_id"] for e in train} == {"d0", "d1"} and all(e["format"]["history_turns"] == 8 for e in train)
    assert [json.loads(l)["id"] for l in (tmp_path / "split/test_inputs.jsonl").read_text().splitlines()] == ["d3"]
    assert corpus_report(scored)["by_split"]["validation"]["claims_per_turn"] == 2.0
    # the compact per-turn format: the same claims coded, the reference first; windows keep their one format
    coded = CliRunner().invoke(app, ["data", "corpus-split", str(labelled), "-o", str(tmp_path / "coded"), "--window-turns", "2",
                                     "--layout", "reference-first", "--answer", "coded"])
    assert coded.exit_code == 0, coded.output
    compact = [json.loads(l) for l in (tmp_path / "coded/train.jsonl").read_text().splitlines()]
    assert [parse_output(e["completion"][0]["content"], "coded") for e in compact] == [parse_output(e["completion"][0]["content"]) for e in train]
    assert all(e["format"]["answer"] == "coded" and e["prompt"][1]["content"].startswith("[REFERENCE]") for e in compact)
    assert all(json.loads(l)["format"]["answer"] == "numbered" for l in (tmp_path / "coded/train_window.jsonl").read_text().splitlines())
    bad = CliRunner().invoke(app, ["data", "corpus-split", str(labelled), "-o", str(tmp_path / "bad"), "--answer", "terse"])
    assert bad.exit_code != 0 and "--layout / --answer" in bad.output and "terse" in bad.output


def test_every_stage_package_installs_under_fastvista():
    """pyproject.toml lists packages by hand: each stage folder with an __init__.py must be there."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from pathlib import Path

    project = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]
    listed, mapped = set(project["packages"]), project["package-dir"]
    for stage, folder in mapped.items():
        for init in Path(folder).rglob("__init__.py"):
            name = ".".join([stage, *init.parent.relative_to(folder).parts])
            assert name in listed, f"{name} ({init.parent}) is not in pyproject's packages"
    assert not any(name.split(".")[0] != "fastvista" for name in listed)
