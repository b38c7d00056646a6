"""The learning curve's pure parts: nested training sets of whole dialogues, the parse share,
the table, and a changed training set refused rather than overwritten."""

import json

import pytest

from fastvista.evaluation.learning_curve import LearningCurveConfig, first_turns, parsed_share, point, table


def examples():
    # dialogues of 3, 2 and 4 turns, in labelling order
    rows = []
    for d, n in (("a", 3), ("b", 2), ("c", 4)):
        rows += [{"dialogue_id": d, "id": f"{d}#{i}", "prompt": [], "completion": []} for i in range(n)]
    return rows


def test_training_sets_are_whole_dialogues_in_order_and_nested():
    rows = examples()
    assert [e["id"] for e in first_turns(rows, 1)] == ["a#0", "a#1", "a#2"]  # never a dialogue cut in two
    assert {e["dialogue_id"] for e in first_turns(rows, 4)} == {"a", "b"}
    assert first_turns(rows, 0) == rows and first_turns(rows, 100) == rows
    small, large = first_turns(rows, 3), first_turns(rows, 5)
    assert large[: len(small)] == small


def test_parsed_share_counts_the_turns_of_failed_dialogues_as_unparsed():
    assert parsed_share({"scored_turns": 90}, [{"id": "x", "unscored_turns": 10}]) == 0.9
    assert parsed_share({"scored_turns": 0}, []) is None


def test_table_rows_show_each_metric_and_a_dash_where_none():
    text = table([{"turns": 250, "dialogues": 50, "parsed": 1.0,
                   "metrics": {"decision agreement": 0.8123, "kappa": 0.55, "turn-score Pearson": None,
                               "claim recall": 0.7, "label accuracy (aligned)": 0.71}}])
    assert "| 250 | 50 | - | 0.812 | 0.550 | - | 0.700 | 0.710 | 1.0 |" in text


def test_a_grown_test_split_is_scored_again_by_the_same_student_and_a_changed_training_is_refused(tmp_path, monkeypatch):
    from fastvista.evaluation import learning_curve

    test = tmp_path / "test_labelled.jsonl"
    test.write_text("a\n")
    cfg = LearningCurveConfig(sft_config="s.yaml", score_config="c.yaml", train_file="t.jsonl", test_inputs="i.jsonl",
                              test_teacher=str(test), sizes=[3])
    validation = first_turns(examples(), 2)
    folder = tmp_path / "turns_3"
    folder.mkdir()
    (folder / "point.json").write_text(json.dumps(learning_curve.manifest(cfg, learning_curve._text(first_turns(examples(), 3)),
                                                                          learning_curve._text(validation))))
    (folder / "student").mkdir()
    (folder / "student" / "training_record.json").write_text("{}")  # trained before
    first = learning_curve.scoring_folder(cfg, folder)
    test.write_text("a\nb\n")  # the corpus grew: the test split's labels changed
    second = learning_curve.scoring_folder(cfg, folder)
    assert first != second and first.parent == second.parent == folder

    commands = []

    def run(cmd, what, accept=(0,)):
        commands.append(cmd)
        raise RuntimeError("stop here")

    monkeypatch.setattr(learning_curve, "_run", run)
    with pytest.raises(RuntimeError, match="stop here"):
        point(cfg, examples(), 3, tmp_path, validation)
    [score] = commands  # no training again: straight to scoring, into the new folder
    assert score[1] == "score" and score[score.index("-o") + 1] == str(second)
    other = LearningCurveConfig(**{**cfg.model_dump(), "sft_keys": {"num_train_epochs": 1}})
    with pytest.raises(ValueError, match="sft_keys"):
        point(other, examples(), 3, tmp_path, validation)
    with pytest.raises(ValueError, match="eval_sha256"):
        point(cfg, examples(), 3, tmp_path, first_turns(examples(), 9))
    assert not (folder / "train.jsonl").exists()  # nothing written over the old point
