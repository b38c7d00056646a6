"""Length-grouped training order: a run resumed inside its second epoch trains what the uninterrupted run trains."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from fastvista.train.length_order import length_ordered


class Recorder(nn.Module):
    """A one-parameter model that records which examples each batch holds."""

    def __init__(self, seen: list):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.seen = seen

    def forward(self, input_ids, idx):
        self.seen.append(idx.tolist())
        return {"loss": (self.w - 1).pow(2).sum() + 0 * input_ids.sum()}


def collate(rows):
    return {"input_ids": torch.zeros(len(rows), 1, dtype=torch.long), "idx": torch.tensor([r["idx"] for r in rows])}


def run(out, dataset, seen, resume=None):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(str(out), per_device_train_batch_size=4, num_train_epochs=2, save_strategy="steps", save_steps=20,
                             report_to="none", use_cpu=True, remove_unused_columns=False, train_sampling_strategy="group_by_length",
                             logging_steps=100, disable_tqdm=True, seed=3)
    trainer = length_ordered(Trainer)(model=Recorder(seen), args=args, train_dataset=dataset, eval_dataset=dataset, data_collator=collate)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_a_run_resumed_in_its_second_epoch_repeats_the_uninterrupted_order(tmp_path):
    from datasets import Dataset

    lengths = torch.randint(1, 200, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    dataset = Dataset.from_list([{"idx": i, "input_ids": [0] * n} for i, n in enumerate(lengths)])
    whole: list = []
    trainer = run(tmp_path / "run", dataset, whole)  # 16 steps an epoch, checkpoint-20 inside the second
    resumed: list = []
    run(tmp_path / "run", dataset, resumed, resume=str(tmp_path / "run" / "checkpoint-20"))
    assert resumed == whole[20:]
    for epoch in (whole[:16], whole[16:]):
        assert sorted(i for batch in epoch for i in batch) == list(range(64))  # every example once an epoch
    assert whole[:16] != whole[16:]  # each epoch in its own order
    def spread(batches):
        return sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)

    shuffled = torch.randperm(64, generator=torch.Generator().manual_seed(2)).view(16, 4).tolist()
    assert spread(whole) < spread(shuffled) / 2  # batches of like length
    eval_order = list(trainer._get_eval_sampler(dataset))
    assert eval_order == list(range(64))  # validation read in order, as without grouping


@pytest.mark.slow
def test_with_two_processes_a_resumed_run_repeats_each_ranks_order(tmp_path):
    """accelerate wraps the sampler in batch-sampler shards whose set_epoch does not reach it: the
    trainer sets the epoch itself (two CPU processes over gloo)."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(root / "tests" / "length_order_ddp.py"), str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"run.rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["resumed"] == rank["whole"][12:]
    for epoch in (slice(0, 8), slice(8, 16)):  # the two ranks share each epoch's examples, each once
        assert sorted(i for rank in ranks for batch in rank["whole"][epoch] for i in batch) == list(range(64))
