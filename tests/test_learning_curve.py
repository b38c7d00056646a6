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


def test_a_point_made_with_other_inputs_is_refused_not_mixed(tmp_path):
    from fastvista.evaluation.learning_curve import manifest

    test = tmp_path / "test_labelled.jsonl"
    test.write_text("a\n")
    cfg = LearningCurveConfig(sft_config="s.yaml", score_config="c.yaml", train_file="t.jsonl", test_inputs="i.jsonl",
                              test_teacher=str(test), sizes=[3])
    folder = tmp_path / "turns_3"
    folder.mkdir()
    text = "".join(json.dumps(e) + "\n" for e in first_turns(examples(), 3))
    (folder / "point.json").write_text(json.dumps(manifest(cfg, text)))
    test.write_text("a\nb\n")  # the corpus grew: the test split's labels changed
    with pytest.raises(ValueError, match="another test_teacher"):
        point(cfg, examples(), 3, tmp_path)
    other = LearningCurveConfig(**{**cfg.model_dump(), "sft_keys": {"num_train_epochs": 1}})
    with pytest.raises(ValueError, match="sft_keys"):
        point(other, examples(), 3, tmp_path)
    assert not (folder / "train.jsonl").exists()  # nothing written over the old point
