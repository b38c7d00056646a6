"""On a CPU the fused LM head projects the answer's positions only (train/lm_head.py): the same
loss and gradients as TRL's every-position projection, from fewer rows."""

import pytest

from tests.test_label_weight import example, lora_grads, trainer_for  # noqa: F401  (example is a fixture)


@pytest.fixture
def projected_rows(monkeypatch):
    """The rows each call of TRL's chunked log-prob function projects; TRL's own position rule is
    restored after the test."""
    import trl.trainer.utils as trl_utils

    monkeypatch.setattr(trl_utils, "_use_triton", trl_utils._use_triton)
    original, rows = trl_utils._ChunkedLogProbFunction, []

    class Spy:
        @staticmethod
        def apply(hidden, *args):
            rows.append(hidden.shape[0])
            return original.apply(hidden, *args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Spy)
    return rows


def test_the_answer_positions_alone_give_the_same_loss_and_gradients(tiny_model, example, projected_rows):  # noqa: F811
    import torch

    from fastvista.train.lm_head import lm_head_positions

    trainer, _ = trainer_for(tiny_model, example, 10.0)  # the corpus recipe weighs decision tokens 10
    batch = trainer.data_collator([trainer.train_dataset[0]])
    assert lm_head_positions("all") == "all"
    every = lora_grads(trainer, batch)
    assert lm_head_positions("answer") == "answer" and lm_head_positions("answer") == "answer"  # twice is harmless
    answer = lora_grads(trainer, batch)
    assert lm_head_positions("all") == "all"  # TRL's own rule again, in the same process
    lora_grads(trainer, batch)

    length, answered = batch["input_ids"].shape[1], int((batch["labels"][:, 1:] != -100).sum())
    assert 0 < answered < length - 1
    assert projected_rows == [length - 1, answered, length - 1]  # TRL's CPU rule projects every position
    assert every.keys() == answer.keys() and every
    for name in every:
        torch.testing.assert_close(answer[name], every[name], rtol=1e-4, atol=1e-6, msg=name)


def test_another_value_is_refused():
    from fastvista.train.lm_head import lm_head_positions

    with pytest.raises(ValueError, match="lm_head_positions must be one of answer, all, not 'Answer'"):
        lm_head_positions("Answer")
