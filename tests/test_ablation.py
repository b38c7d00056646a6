"""The teacher's ablation table: each switch on each data set, one engine, one table."""

import pytest
import yaml

from fastvista.evaluation.ablation import AblationConfig, main, table
from fastvista.records_io import read_scored, write_jsonl
from fastvista.schema import Gold
from tests.scripted import ScriptedBackend
from tests.test_pipeline import museum_dialogue


def test_each_variant_runs_on_each_data_set_with_its_switches(tmp_path):
    dialogues = []
    for i, labels in enumerate(["HHF", "HFF"]):
        d = museum_dialogue(i)
        for index, label in zip((1, 3, 5), labels):
            d.turns[index].gold = Gold(label="hallucinated" if label == "H" else "faithful")
        dialogues.append(d)
    write_jsonl(tmp_path / "museum.jsonl", dialogues)
    synth = tmp_path / "synth.yaml"
    synth.write_text(yaml.safe_dump({"backend": {"kind": "openai", "model": "scripted"}, "teacher": {"few_shot": 2}}))
    cfg = AblationConfig(synth_config=str(synth), variants={"full": {}, "no accumulation": {"accumulate": False}},
                         data={"museum": {"input": str(tmp_path / "museum.jsonl")},
                               "museum, 1 retry": {"input": str(tmp_path / "museum.jsonl"), "teacher": {"retries": 1}}})
    cells = main(cfg, tmp_path / "out", backend_factory=ScriptedBackend)
    assert cells["museum"]["no accumulation"]["settings"]["accumulate"] is False
    assert cells["museum"]["full"]["settings"]["few_shot"] == 2  # the synth config's settings are the base
    assert all(r["settings"]["retries"] == 1 for r in cells["museum, 1 retry"].values())  # a data set's own needs

    def verified_in_turn_3(variant):
        scored = read_scored(tmp_path / "out" / "museum" / variant / "labelled.jsonl")
        return sum(c.label.value == "VERIFIED" for d in scored for t in d.turns if t.index == 3 for c in t.claims)

    # "The Louvre is in Paris." in turn 3 is verified by the store that turn 1 filled
    assert verified_in_turn_3("full") == verified_in_turn_3("no accumulation") + len(dialogues)
    text = (tmp_path / "out" / "ablation.md").read_text()
    assert text.splitlines()[0].startswith("| variant | museum: turn acc | museum: F1 (halluc. +) |")
    assert "right" not in text.splitlines()[0]  # no probe columns without a probe
    assert text.count("\n| full |") == 1 and "| no accumulation |" in text


def test_the_table_gives_a_probe_its_right_decisions_per_version():
    row = {"turn_accuracy": 0.5, "turn_f1": 0.6, "calls_per_turn": 3.0, "prompt_tokens_per_turn": 900.0,
           "probe": {"contradict": {"correct_decision_share": 0.8}, "restate": {"correct_decision_share": 0.4}}}
    text = table({"probe": {"full": row}})
    assert "probe: contradict right" in text and "| full | 0.5 | 0.6 | - | 3.0 | 900.0 | 0.8 | - | 0.4 | - |" in text


def test_a_data_set_may_not_set_a_switch_the_variants_compare():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="would not be the full teacher"):
        AblationConfig(synth_config="x.yaml", variants={"full": {}, "no history": {"history": False}},
                       data={"d": {"input": "x.jsonl", "teacher": {"history": False}}})


def test_a_data_set_that_skips_bad_records_reports_each_and_counts_them(tmp_path):
    from fastvista.records_io import to_json_line

    d = museum_dialogue(0)
    d.turns[1].gold = Gold(label="hallucinated")
    (tmp_path / "museum.jsonl").write_text(to_json_line(d) + '{"id": "broken"}\n')
    synth = tmp_path / "synth.yaml"
    synth.write_text(yaml.safe_dump({"backend": {"kind": "openai", "model": "scripted"}}))
    cfg = AblationConfig(synth_config=str(synth), variants={"full": {}},
                         data={"museum": {"input": str(tmp_path / "museum.jsonl"), "skip_bad": True}})
    cells = main(cfg, tmp_path / "out", backend_factory=ScriptedBackend)
    assert cells["museum"]["full"]["skipped_records"] == 1
    [line] = (tmp_path / "out" / "museum" / "skipped.jsonl").read_text().splitlines()
    assert '"line": 2' in line
    strict = AblationConfig(synth_config=str(synth), variants={"full": {}}, data={"museum": {"input": str(tmp_path / "museum.jsonl")}})
    with pytest.raises(Exception, match="museum.jsonl:2"):
        main(strict, tmp_path / "strict", backend_factory=ScriptedBackend)
