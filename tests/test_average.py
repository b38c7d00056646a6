"""Tail weight averaging: the averaged adapter's delta is the mean of its sources' deltas."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fastvista import cli
from fastvista.contract import StudentFormat, read_format, write_format

FORMAT = StudentFormat(history_turns=4, turns_per_call=1, max_store_claims=64)


def adapter(base, folder, seed, **lora):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = LoraConfig(**{"r": 2, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "init_lora_weights": False, **lora})
    get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)), config).save_pretrained(str(folder))
    return folder


def merged_state(base, folder):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)), str(folder))
    return {k: v.clone() for k, v in model.merge_and_unload().state_dict().items()}


@pytest.mark.parametrize("rslora", [False, True])
def test_the_averaged_adapter_merges_into_the_mean_of_its_sources_merged(tiny_model, tmp_path, rslora):
    import torch

    sources = [adapter(tiny_model, tmp_path / f"checkpoint-{i}", seed=i, use_rslora=rslora) for i in range(3)]
    write_format(sources[-1], FORMAT)  # checkpoints carry no format; the run's final adapter does

    result = CliRunner().invoke(cli.app, ["average", *map(str, sources), "-o", str(tmp_path / "mean")])
    assert result.exit_code == 0, result.output

    states = [merged_state(tiny_model, s) for s in sources]
    averaged = merged_state(tiny_model, tmp_path / "mean")
    base = merged_state(tiny_model, sources[0])  # keys only
    changed = [k for k in base if not torch.equal(states[0][k], states[1][k])]
    assert changed, "the sources must differ for the test to mean anything"
    for key in base:
        expected = sum(s[key] for s in states) / len(states)
        assert torch.allclose(averaged[key], expected, atol=1e-6), key
    config = json.loads((tmp_path / "mean" / "adapter_config.json").read_text())
    assert config["r"] == 6
    assert read_format(tmp_path / "mean") == FORMAT
    provenance = json.loads((tmp_path / "mean" / "averaged.json").read_text())
    assert [s["adapter"] for s in provenance["sources"]] == list(map(str, sources))
    assert not (tmp_path / "mean.partial").exists()


def test_adapters_of_different_runs_or_without_a_format_are_refused(tiny_model, tmp_path):
    a = adapter(tiny_model, tmp_path / "a", seed=0)
    b = adapter(tiny_model, tmp_path / "b", seed=1, r=4)
    write_format(b, FORMAT)
    result = CliRunner().invoke(cli.app, ["average", str(a), str(b), "-o", str(tmp_path / "mean")])
    assert result.exit_code != 0 and "b/adapter_config.json: r differ" in result.output
    assert not (tmp_path / "mean").exists()

    c = adapter(tiny_model, tmp_path / "c", seed=2)
    result = CliRunner().invoke(cli.app, ["average", str(a), str(c), "-o", str(tmp_path / "mean")])
    assert result.exit_code != 0 and "records its student format" in result.output

    d = adapter(tiny_model, tmp_path / "d", seed=3, use_dora=True)
    e = adapter(tiny_model, tmp_path / "e", seed=4, use_dora=True)
    write_format(e, FORMAT)
    result = CliRunner().invoke(cli.app, ["average", str(d), str(e), "-o", str(tmp_path / "mean")])
    assert result.exit_code != 0 and "use_dora: a LoRA variant" in result.output

    result = CliRunner().invoke(cli.app, ["average", str(a), str(tmp_path / "nowhere"), "-o", str(tmp_path / "mean")])
    assert result.exit_code != 0 and "no adapter_model.safetensors" in result.output


def test_the_output_never_replaces_a_folder_or_touches_an_input(tiny_model, tmp_path):
    run = tmp_path / "run"
    a, b = adapter(tiny_model, run / "checkpoint-1", seed=0), adapter(tiny_model, run / "checkpoint-2", seed=1)
    write_format(b, FORMAT)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for out, why in [(a, "overlaps the input"), (run, "overlaps the input"), (tmp_path / "new" / ".." / "run", "overlaps the input"),
                     (elsewhere, "exists")]:
        result = CliRunner().invoke(cli.app, ["average", str(a), str(b), "-o", str(out)])
        assert result.exit_code != 0 and why in result.output, result.output
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before

    result = CliRunner().invoke(cli.app, ["average", str(a), str(b), "-o", str(a / "mean")])
    assert result.exit_code != 0 and "overlaps the input" in result.output
    result = CliRunner().invoke(cli.app, ["average", str(a), str(b), str(tmp_path / "run" / "." / "checkpoint-2"), "-o", str(tmp_path / "mean")])
    assert result.exit_code != 0 and "the same weights as" in result.output


def test_checkpoints_whose_module_lists_are_written_in_another_order_average(tiny_model, tmp_path):
    a, b = adapter(tiny_model, tmp_path / "a", seed=0), adapter(tiny_model, tmp_path / "b", seed=1)
    write_format(b, FORMAT)
    config = json.loads((b / "adapter_config.json").read_text())
    (b / "adapter_config.json").write_text(json.dumps({**config, "target_modules": config["target_modules"][::-1]}))
    result = CliRunner().invoke(cli.app, ["average", str(a), str(b), "-o", str(tmp_path / "mean")])
    assert result.exit_code == 0, result.output
    assert "rank 4" in result.output


@pytest.mark.parametrize("rslora", [False, True])
def test_a_truncated_mean_merges_into_the_best_low_rank_approximation_of_the_exact_mean(tiny_model, tmp_path, rslora):
    import torch
    from transformers import AutoModelForCausalLM

    sources = [adapter(tiny_model, tmp_path / f"checkpoint-{i}", seed=i, use_rslora=rslora) for i in range(3)]
    write_format(sources[-1], FORMAT)
    for name, extra in (("mean", []), ("rank2", ["--rank", "2"])):
        result = CliRunner().invoke(cli.app, ["average", *map(str, sources), "-o", str(tmp_path / name), *extra])
        assert result.exit_code == 0, result.output

    base = merged_state(tiny_model, sources[0])  # keys only
    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model)).state_dict()
    exact, small = merged_state(tiny_model, tmp_path / "mean"), merged_state(tiny_model, tmp_path / "rank2")
    provenance = json.loads((tmp_path / "rank2" / "averaged.json").read_text())
    kept = []
    for key in base:
        delta = (exact[key] - plain[key]).double()
        if not delta.abs().sum():
            assert torch.equal(small[key], plain[key]), key
            continue
        u, values, vh = torch.linalg.svd(delta)
        best = (u[:, :2] * values[:2]) @ vh[:2]
        assert torch.allclose((small[key] - plain[key]).double(), best, atol=1e-5), key
        assert values[2] > 1e-4, "the exact mean must have rank above 2 for the test to mean anything"
        kept.append(float((values[:2] ** 2).sum() / (values ** 2).sum()))
    assert json.loads((tmp_path / "rank2" / "adapter_config.json").read_text())["r"] == 2
    assert provenance["rank"] == 2 and provenance["exact_rank"] == 6
    assert provenance["norm_kept"]["least"] == pytest.approx(min(kept), abs=1e-6)
    assert provenance["norm_kept"]["mean_over_modules"] == pytest.approx(sum(kept) / len(kept), abs=1e-6)


def test_a_rank_above_the_exact_means_is_refused(tiny_model, tmp_path):
    sources = [adapter(tiny_model, tmp_path / f"checkpoint-{i}", seed=i) for i in range(2)]
    write_format(sources[-1], FORMAT)
    result = CliRunner().invoke(cli.app, ["average", *map(str, sources), "-o", str(tmp_path / "mean"), "--rank", "5"])
    assert result.exit_code != 0
    assert "rank 5" in result.output and "4" in result.output
    assert not (tmp_path / "mean").exists() and not (tmp_path / "mean.partial").exists()


def test_a_bias_trained_adapter_is_refused_and_an_input_is_never_the_build_folder(tiny_model, tmp_path):
    sources = [adapter(tiny_model, tmp_path / f"checkpoint-{i}", seed=i, lora_bias=True) for i in range(2)]
    write_format(sources[-1], FORMAT)
    result = CliRunner().invoke(cli.app, ["average", *map(str, sources), "-o", str(tmp_path / "mean")])
    assert result.exit_code != 0 and "lora_bias" in result.output  # PEFT scales the bias with B A

    inside = tmp_path / "part"
    plain = [adapter(tiny_model, inside / name, seed=i) for i, name in enumerate(("mean.partial", "c2"))]
    write_format(plain[-1], FORMAT)
    result = CliRunner().invoke(cli.app, ["average", *map(str, plain), "-o", str(inside / "mean")])
    assert result.exit_code != 0 and "mean.partial" in result.output
    assert (inside / "mean.partial" / "adapter_model.safetensors").exists()
