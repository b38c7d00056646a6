"""The teacher's ablation table: each switch on each data set, one engine, one table."""

import pytest
import yaml

from fastvista.evaluation.ablation import AblationConfig, failures, main, table
from fastvista.records_io import RecordError, read_scored, to_json_line, write_jsonl
from fastvista.scheduler import StaleResults, read_failed
from fastvista.schema import Gold, GoldClaim
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
    header = text.splitlines()[2]
    assert header.startswith("| variant | n | failed | left out | turn acc | precision | recall | F1 (halluc. +) | macro-F1 | always halluc. acc / F1 |")
    assert "right" not in header  # no probe columns without a probe
    assert text.count("\n| full |") == 2 and "### museum, 1 retry" in text
    full = cells["museum"]["full"]
    assert f"| full | 6 | 0 | 0 | {full['turn_accuracy']} | {full['turn_precision']} |" in text


def test_the_table_gives_a_probe_its_right_decisions_per_version():
    row = {"turn_accuracy": 0.5, "turn_f1": 0.6, "calls_per_turn": 3.0, "prompt_tokens_per_turn": 900.0,
           "probe": {"contradict": {"correct_decision_share": 0.8}, "restate": {"correct_decision_share": 0.4}}}
    text = table({"probe": {"full": row}})
    assert "| contradict right |" in text and "| full | - | - | - | 0.5 | - | - | 0.6 | - | - | - | 3.0 | 900.0 | 0.8 | - | 0.4 | - |" in text


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
    assert cells["museum"]["full"]["left_out_inputs"] == 1
    [line] = (tmp_path / "out" / "museum" / "skipped.jsonl").read_text().splitlines()
    assert '"line": 2' in line
    strict = AblationConfig(synth_config=str(synth), variants={"full": {}}, data={"museum": {"input": str(tmp_path / "museum.jsonl")}})
    with pytest.raises(Exception, match="museum.jsonl:2"):
        main(strict, tmp_path / "strict", backend_factory=ScriptedBackend)


def museum_files(tmp_path, single_turn=False, gold_claims=False):
    dialogues = []
    for i in range(2):
        d = museum_dialogue(i)
        for index in (1, 3, 5):
            if single_turn and index != 1:
                d.turns[index].score = False
            else:
                claims = [GoldClaim(text="The Louvre is in Paris.", label="VERIFIED")] if gold_claims else None
                d.turns[index].gold = Gold(label="faithful", claims=claims)
        dialogues.append(d)
    write_jsonl(tmp_path / "museum.jsonl", dialogues)
    synth = tmp_path / "synth.yaml"
    synth.write_text(yaml.safe_dump({"backend": {"kind": "openai", "model": "scripted"}}))
    return str(synth), str(tmp_path / "museum.jsonl")


VARIANTS = {"full": {}, "no history": {"history": False}, "no accumulation": {"accumulate": False},
            "no history, no accumulation": {"history": False, "accumulate": False}}


def test_a_variant_that_cannot_change_the_labels_is_not_run_and_says_which_it_equals(tmp_path):
    synth, single = museum_files(tmp_path / "single", single_turn=True)
    _, gold = museum_files(tmp_path / "gold", gold_claims=True)
    cfg = AblationConfig(synth_config=synth, variants=VARIANTS,
                         data={"single": {"input": single}, "gold": {"input": gold, "teacher": {"gold_claims": True}}})
    cells = main(cfg, tmp_path / "out", backend_factory=ScriptedBackend)
    assert cells["single"]["no accumulation"]["same_as"] == "full"
    assert cells["single"]["no history, no accumulation"]["same_as"] == "no history"
    assert cells["gold"]["no history"]["same_as"] == "full"
    assert cells["gold"]["no history, no accumulation"]["same_as"] == "no accumulation"
    assert "turn_accuracy" in cells["single"]["no history"] and "turn_accuracy" in cells["gold"]["no accumulation"]
    assert not (tmp_path / "out" / "single" / "no accumulation").exists()  # nothing was labelled for it
    text = (tmp_path / "out" / "ablation.md").read_text()
    assert "| no accumulation | n/a | n/a | n/a |" in text and "n/a: no history = full by construction (history only shapes" in text


class CountingBackend(ScriptedBackend):
    built = 0

    def __init__(self):
        super().__init__()
        CountingBackend.built += 1


def test_bad_data_settings_and_stale_results_stop_the_run_before_any_engine_starts(tmp_path):
    synth, museum = museum_files(tmp_path)
    _, no_claims = museum_files(tmp_path / "plain")
    CountingBackend.built = 0
    missing = AblationConfig(synth_config=synth, variants={"full": {}}, data={"a": {"input": museum}, "b": {"input": str(tmp_path / "nope.jsonl")}})
    with pytest.raises(RecordError, match="nope.jsonl: no such file"):
        main(missing, tmp_path / "out", backend_factory=CountingBackend)
    needs_claims = AblationConfig(synth_config=synth, variants={"full": {}},
                                  data={"a": {"input": museum}, "b": {"input": no_claims, "teacher": {"gold_claims": True}}})
    with pytest.raises(ValueError, match="d0 turn 1 has no human claims"):
        main(needs_claims, tmp_path / "out", backend_factory=CountingBackend)
    main(AblationConfig(synth_config=synth, variants={"full": {}}, data={"a": {"input": museum}}), tmp_path / "out", backend_factory=CountingBackend)
    assert CountingBackend.built == 1
    changed = AblationConfig(synth_config=synth, synth_overrides=["teacher.few_shot=1"], variants={"full": {}},
                             data={"z": {"input": museum}, "a": {"input": museum}})
    with pytest.raises(StaleResults, match="a/full/labelled.jsonl"):
        main(changed, tmp_path / "out", backend_factory=CountingBackend)
    assert CountingBackend.built == 1 and not (tmp_path / "out" / "z").exists()


def test_failed_dialogues_are_written_per_cell_counted_and_retried(tmp_path):
    synth, museum = museum_files(tmp_path)
    broken = museum_dialogue(7)
    broken.id = "broken"
    broken.turns[1].text = "GARBLE is a word."
    broken.turns[1].gold = Gold(label="faithful")
    with open(museum, "a") as f:
        f.write(to_json_line(broken))
    cfg = AblationConfig(synth_config=synth, variants={"full": {}}, data={"museum": {"input": museum}})
    cells = main(cfg, tmp_path / "out", backend_factory=ScriptedBackend)
    assert cells["museum"]["full"]["failed_dialogues"] == 1 and failures(cells) == ["museum/full: 1"]
    [failed] = read_failed(tmp_path / "out" / "museum" / "full")
    assert failed["id"] == "broken" and "no readable label" in failed["reason"]
    assert "| full | 6 | 1 | 0 |" in (tmp_path / "out" / "ablation.md").read_text()


def test_the_cli_exits_3_when_a_cell_failed(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from fastvista import cli
    from fastvista.evaluation import ablation

    monkeypatch.setattr(ablation, "ablation", lambda cfg, out, backend_factory=None: {"d": {"full": {"failed_dialogues": 2}, "x": {"same_as": "full"}}})
    synth, museum = museum_files(tmp_path)
    config = tmp_path / "ablation.yaml"
    config.write_text(yaml.safe_dump({"synth_config": synth, "variants": {"full": {}}, "data": {"d": {"input": museum}}}))
    result = CliRunner().invoke(cli.app, ["eval", "ablation", "-c", str(config), "-o", str(tmp_path / "out")])
    assert result.exit_code == 3 and "d/full: 2" in result.output


def test_a_changed_input_is_refused_before_the_engine_starts_and_keeps_the_last_failures(tmp_path):
    synth, museum = museum_files(tmp_path)
    cfg = AblationConfig(synth_config=synth, variants={"full": {}}, data={"a": {"input": museum}, "b": {"input": museum}})
    main(cfg, tmp_path / "out", backend_factory=ScriptedBackend)
    (tmp_path / "out" / "b" / "full" / "failed.jsonl").write_text('{"id": "x", "reason": "an earlier outage"}\n')
    edited = read_scored(tmp_path / "out" / "a" / "full" / "labelled.jsonl")[0].dialogue
    edited.turns[1].text = "The Louvre is in Lyon."
    other = tmp_path / "other.jsonl"
    write_jsonl(other, [edited])
    CountingBackend.built = 0
    changed = AblationConfig(synth_config=synth, variants={"full": {}}, data={"a": {"input": museum}, "b": {"input": str(other)}})
    with pytest.raises(StaleResults, match="b/full/labelled.jsonl: dialogue 'd0' was scored from another version"):
        main(changed, tmp_path / "out", backend_factory=CountingBackend)
    assert CountingBackend.built == 0
    assert read_failed(tmp_path / "out" / "b" / "full") == [{"id": "x", "reason": "an earlier outage"}]


class DownForB(ScriptedBackend):
    """A backend that fails every call about the dialogues of data set b (ids b*)."""

    def generate(self, requests):
        from fastvista.llm import Completion

        answers = super().generate(requests)
        return [Completion(text="", error="backend: server down") if "wing b" in str(r.messages) else a for r, a in zip(requests, answers)]


def test_a_cell_whose_every_dialogue_failed_is_a_row_and_the_table_goes_on(tmp_path):
    synth, museum = museum_files(tmp_path)
    down = museum_dialogue(5)
    down.id = "b0"
    down.turns[1].reference += " The wing b is closed."
    down.turns[1].gold = Gold(label="faithful")
    write_jsonl(tmp_path / "b.jsonl", [down])
    cfg = AblationConfig(synth_config=synth, variants={"full": {}}, data={"b": {"input": str(tmp_path / "b.jsonl")}, "a": {"input": museum}})
    cells = main(cfg, tmp_path / "out", backend_factory=DownForB)
    assert cells["b"]["full"] == {"settings": cells["a"]["full"]["settings"], "turns": 0, "failed_dialogues": 1, "left_out_inputs": 0}
    assert cells["a"]["full"]["turn_accuracy"] is not None  # the table went on past the failed cell
    assert failures(cells) == ["b/full: 1"] and "| full | - | 1 | 0 | - |" in (tmp_path / "out" / "ablation.md").read_text()


def test_an_empty_data_set_a_repeated_id_and_a_typo_in_the_synth_config_are_refused_at_once(tmp_path):
    synth, museum = museum_files(tmp_path)
    d = museum_dialogue(0)
    for t in d.turns:
        t.score = False
    write_jsonl(tmp_path / "nothing.jsonl", [d])
    write_jsonl(tmp_path / "twice.jsonl", [museum_dialogue(0), museum_dialogue(0)])
    for data, message in (({"input": str(tmp_path / "nothing.jsonl")}, "no dialogue with a turn to score"),
                          ({"input": str(tmp_path / "twice.jsonl")}, "dialogue id 'd0' is given twice")):
        with pytest.raises(ValueError, match=message):
            main(AblationConfig(synth_config=synth, variants={"full": {}}, data={"a": {"input": museum}, "z": data}), tmp_path / "out",
                 backend_factory=CountingBackend)
    with pytest.raises(ValueError, match="teachr"):
        main(AblationConfig(synth_config=synth, synth_overrides=["teachr.few_shot=0"], variants={"full": {}}, data={"a": {"input": museum}}),
             tmp_path / "out", backend_factory=CountingBackend)
    with pytest.raises(ValueError, match="variant name '../up'"):
        AblationConfig(synth_config=synth, variants={"../up": {}}, data={"a": {"input": museum}})
    assert not (tmp_path / "out" / "a").exists()
