"""Run by tests/test_length_order.py under `torchrun --nproc_per_node 2`: each rank trains the toy
length-grouped run whole, then again resumed from a checkpoint inside its second epoch, and writes
the batches it saw in both to OUT.rankN.json."""

import json
import sys

import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments

from fastvista.train.length_order import length_ordered
from tests.test_length_order import Recorder, collate

out = sys.argv[1]
lengths = torch.randint(1, 200, (64,), generator=torch.Generator().manual_seed(1)).tolist()
dataset = Dataset.from_list([{"idx": i, "input_ids": [0] * n} for i, n in enumerate(lengths)])
seen = {"whole": [], "resumed": []}
for run, resume in (("whole", None), ("resumed", f"{out}/checkpoint-12")):  # 8 steps an epoch over the two ranks
    args = TrainingArguments(out, per_device_train_batch_size=4, num_train_epochs=2, save_strategy="steps", save_steps=12,
                             report_to="none", use_cpu=True, remove_unused_columns=False, train_sampling_strategy="group_by_length",
                             logging_steps=100, disable_tqdm=True, seed=3, ddp_backend="gloo")
    length_ordered(Trainer)(model=Recorder(seen[run]), args=args, train_dataset=dataset, data_collator=collate).train(resume_from_checkpoint=resume)
with open(f"{out}.rank{args.process_index}.json", "w") as f:
    json.dump(seen, f)
# Both ranks leave together with their process group closed: a rank that exits while the other's gloo
# threads still hold its connection can abort ("terminate called without an active exception").
torch.distributed.barrier()
torch.distributed.destroy_process_group()
