"""The CPU training precision rule: bf16 only where the CPU computes it natively."""

import json

import pytest

from fastvista.train.precision import cpu_precision, resumed_precision


@pytest.mark.parametrize("mixed,dtype,expected", [("bf16", "bfloat16", "no"), ("bf16", "float32", "no"), ("no", "bfloat16", "no"),
                                                  ("fp16", "bfloat16", "fp16")])
def test_a_cpu_without_native_bf16_trains_in_float32_and_says_so(mixed, dtype, expected):
    got_mixed, got_dtype, note = cpu_precision(mixed, dtype, on_cpu=True, native=False, fallback="float32")
    assert (got_mixed, got_dtype) == (expected, "float32") and "no native bf16" in note


@pytest.mark.parametrize("on_cpu,native", [(True, True), (False, False)])
def test_native_bf16_and_accelerators_keep_what_was_asked(on_cpu, native):
    assert cpu_precision("bf16", "bfloat16", on_cpu=on_cpu, native=native, fallback="float32") == ("bf16", "bfloat16", None)


@pytest.mark.parametrize("mixed,dtype", [("no", "float32"), ("fp16", "float16")])
def test_runs_that_ask_for_no_bf16_are_never_changed(mixed, dtype):
    assert cpu_precision(mixed, dtype, on_cpu=True, native=False, fallback="fail") == (mixed, dtype, None)


def test_keep_trains_in_bf16_with_a_warning_and_fail_refuses_naming_the_fix():
    mixed, dtype, note = cpu_precision("bf16", "bfloat16", on_cpu=True, native=False, fallback="keep")
    assert (mixed, dtype) == ("bf16", "bfloat16") and "slower" in note
    with pytest.raises(ValueError, match="--bf16 false --dtype float32"):
        cpu_precision("bf16", "bfloat16", on_cpu=True, native=False, fallback="fail")
    with pytest.raises(ValueError, match="bf16_fallback must be one of"):
        cpu_precision("bf16", "bfloat16", on_cpu=True, native=False, fallback="fp32")


def test_a_resume_in_another_precision_is_noted():
    bf16, fp32 = {"mixed_precision": "bf16", "dtype": "bfloat16"}, {"mixed_precision": "no", "dtype": "float32"}
    assert resumed_precision([], fp32) is None and resumed_precision([fp32], fp32) is None
    assert "after chunks trained in" in resumed_precision([bf16], fp32)


def sft_args(tmp_path, model, **training):
    from trl import ModelConfig, SFTConfig

    from fastvista.train.sft import StudentArguments

    return (StudentArguments(train_file="unused"), SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **training),
            ModelConfig(model_name_or_path=str(model)))


@pytest.mark.parametrize("training,dtype", [({"bf16": True}, "bfloat16"), ({}, "auto"), ({}, None)])
def test_sft_sets_what_the_accelerator_and_loader_read(tmp_path, tiny_model, monkeypatch, training, dtype):
    """bf16 asked by the config, or by weights loaded as the checkpoint's own dtype (bf16 here)."""
    import fastvista.precision as precision
    from fastvista.train.sft import choose_precision

    config = json.loads((tiny_model / "config.json").read_text())
    (tiny_model / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    try:
        monkeypatch.setattr(precision, "native_cpu_bf16", lambda: False)
        student, args, model = sft_args(tmp_path, tiny_model, **training)
        model.dtype = dtype
        assert "no native bf16" in choose_precision(student, args, model, str(tiny_model))
        assert (args.mixed_precision, args.bf16, model.dtype) == ("no", False, "float32")
    finally:
        (tiny_model / "config.json").write_text(json.dumps(config))


def test_sft_counts_bf16_set_by_accelerate_launch(tmp_path, tiny_model, monkeypatch):
    import fastvista.precision as precision
    from fastvista.train.sft import choose_precision

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what `accelerate launch --mixed_precision bf16` sets
    monkeypatch.setattr(precision, "native_cpu_bf16", lambda: False)
    student, args, model = sft_args(tmp_path, tiny_model, bf16=False)
    assert args.mixed_precision == "bf16"
    choose_precision(student, args, model, str(tiny_model))
    assert args.mixed_precision == "no"


@pytest.mark.parametrize("dtype,on_cpu,native,keep,expected", [
    ("bfloat16", True, False, False, "float32"),
    ("auto", True, False, False, "float32"),  # vLLM's auto on a CPU picks bf16 even for a float32 checkpoint
    ("float16", True, False, False, "float32"),
    ("float32", True, False, False, "float32"),
    ("bfloat16", True, True, False, "bfloat16"),
    ("auto", True, True, False, "auto"),
    ("bfloat16", False, False, False, "bfloat16"),
    ("bfloat16", True, False, True, "bfloat16"),
])
def test_inference_computes_in_float32_only_where_half_precision_would_be_emulated(dtype, on_cpu, native, keep, expected):
    from fastvista.precision import inference_dtype

    assert inference_dtype(dtype, on_cpu, native, keep) == expected


def test_an_hf_engine_asked_for_bf16_loads_float32_weights_on_a_cpu_without_it(tiny_model, monkeypatch):
    import torch

    from fastvista.llm import BackendConfig
    from fastvista.llm.hf_backend import HFBackend

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(precision_module(), "native_cpu_bf16", lambda: False)
    assert HFBackend(BackendConfig(kind="hf", model=str(tiny_model), dtype="bfloat16")).model.dtype == torch.float32
    kept = BackendConfig(kind="hf", model=str(tiny_model), dtype="bfloat16", keep_bf16_on_cpu=True)
    assert HFBackend(kept).model.dtype == torch.bfloat16


def test_a_served_engine_is_started_in_the_dtype_the_in_process_one_computes_in(tiny_model, monkeypatch):
    from fastvista.infer.serve import served_dtype

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(precision_module(), "native_cpu_bf16", lambda: False)
    assert served_dtype(str(tiny_model), "bfloat16") == "float32" and served_dtype(str(tiny_model), "bfloat16", True) == "bfloat16"


def test_the_cache_key_names_the_dtype_the_weights_compute_in(tiny_model, monkeypatch):
    """bf16 answers from a CPU with native bf16 are never served to a run that computes in float32."""
    from fastvista.llm import BackendConfig, fingerprint

    config = BackendConfig(kind="hf", model=str(tiny_model), dtype="bfloat16")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(precision_module(), "native_cpu_bf16", lambda: True)
    assert fingerprint(config)["dtype"] == "bfloat16"
    monkeypatch.setattr(precision_module(), "native_cpu_bf16", lambda: False)
    assert fingerprint(config)["dtype"] == "float32"
    assert fingerprint(config.model_copy(update={"keep_bf16_on_cpu": True}))["dtype"] == "bfloat16"


def test_the_cpu_memory_check_counts_widened_weights(tmp_path):
    from fastvista.llm import ConfigError
    from fastvista.llm.vllm_backend import CPU_ENGINE_OVERHEAD_BYTES, cpu_memory_plan

    (tmp_path / "model.safetensors").write_bytes(b"0" * 1000)
    room = CPU_ENGINE_OVERHEAD_BYTES + 100 + 1500
    assert cpu_memory_plan(100, str(tmp_path), room) == 100
    with pytest.raises(ConfigError, match="weights"):
        cpu_memory_plan(100, str(tmp_path), room, weight_factor=2)


def precision_module():
    import fastvista.precision

    return fastvista.precision
