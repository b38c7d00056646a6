"""Batches of like length (`train_sampling_strategy: group_by_length`) whose order a resumed run repeats.

transformers' LengthGroupedSampler draws each epoch's order from the global random state, which a
resumed run restores only after skipping the batches it already trained: a run resumed inside its
second epoch skips other batches than it trained, so some examples train twice and some never.
Here each epoch's order is drawn from (seed, epoch) alone. Validation keeps its plain order: its
loss is a mean over batches, and batches of another make-up would give another number.
"""

from __future__ import annotations


def epoch_seeded_length_sampler(lengths: list[int], batch_size: int, seed: int):
    import torch
    from torch.utils.data import Sampler
    from transformers.trainer_pt_utils import get_length_grouped_indices

    class EpochSeededLengthSampler(Sampler):
        def __init__(self):
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:  # the Trainer calls it before each epoch, a resumed one too
            self.epoch = epoch

        def __len__(self) -> int:
            return len(lengths)

        def __iter__(self):
            generator = torch.Generator().manual_seed(seed + self.epoch)
            return iter(get_length_grouped_indices(lengths, batch_size, generator=generator))

    return EpochSeededLengthSampler()


def length_ordered(trainer_class):
    """`trainer_class` whose length-grouped training order depends on the seed and epoch only, and
    whose validation is read in order."""
    from torch.utils.data import SequentialSampler
    from transformers.trainer_pt_utils import LengthGroupedSampler
    from transformers.trainer_utils import has_length

    class LengthOrdered(trainer_class):
        length_sampler = None

        def _get_train_sampler(self, train_dataset=None):
            sampler = super()._get_train_sampler(train_dataset)
            if isinstance(sampler, LengthGroupedSampler):
                seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
                sampler = self.length_sampler = epoch_seeded_length_sampler(sampler.lengths, sampler.batch_size, seed)
            return sampler

        def _run_epoch(self, *args, epoch, **kwargs):
            # Set here, not only through the data loader: with several processes accelerate wraps the
            # sampler in batch-sampler shards (and a resumed epoch in a skipping one) whose set_epoch
            # never reaches it, and a resumed epoch would replay the first one's order.
            if self.length_sampler is not None:
                self.length_sampler.set_epoch(epoch)
            return super()._run_epoch(*args, epoch=epoch, **kwargs)

        def _get_eval_sampler(self, eval_dataset):
            if eval_dataset is None or not has_length(eval_dataset):
                return None
            return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None

    return LengthOrdered
