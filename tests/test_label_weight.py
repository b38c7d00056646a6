"""label_weight: the loss of the token deciding each claim's label weighs `weight` times, through
TRL's own loss (fused LM head) and a LoRA adapter as the student trains."""

import pytest

from fastvista.contract import StudentFormat
from fastvista.labels import Label
from fastvista.synth.pipeline import TeacherConfig
from fastvista.synth.training_set import training_examples
from tests.test_pipeline import drive, museum_dialogue


@pytest.fixture(scope="module")
def example():
    [first, *_] = training_examples(drive(museum_dialogue(0), TeacherConfig(), _backend()), StudentFormat(history_turns=8, max_store_claims=64))
    return first


def _backend():
    from tests.scripted import ScriptedBackend

    return ScriptedBackend()


def trainer_for(tiny_model, example, weight):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from fastvista.train.label_weight import decision_weighted

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    args = SFTConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, max_length=4096, report_to="none", seed=0)
    data = Dataset.from_list([{"prompt": example["prompt"], "completion": example["completion"]}])
    cls = decision_weighted(SFTTrainer, weight, tokenizer) if weight != 1 else SFTTrainer
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)  # non-zero B: every LoRA weight has a gradient
    return cls(model=str(tiny_model), args=args, train_dataset=data, processing_class=tokenizer, peft_config=lora), tokenizer


def lora_grads(trainer, batch):
    import torch

    torch.manual_seed(0)
    model = trainer.model
    model.train()
    model.zero_grad()
    trainer.compute_loss(model, dict(batch)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_the_decision_tokens_loss_weighs_weight_times(tiny_model, example):
    import torch

    from fastvista.train.label_weight import decision_positions, decision_tokens

    weighted, tokenizer = trainer_for(tiny_model, example, 5.0)
    batch = weighted.data_collator([weighted.train_dataset[0]])
    positions = decision_positions(batch["input_ids"], batch["labels"], decision_tokens(tokenizer))
    lines = example["completion"][0]["content"].splitlines()
    assert positions.sum().item() == len(lines) > 0  # one decision per claim line, none in the prompt
    decided = [tokenizer.decode([t]).strip() for t in batch["input_ids"][0][1:][positions[0][:-1]].tolist()]
    assert all(d and line.rsplit(" | ", 1)[1].startswith(d) for d, line in zip(decided, lines))

    hooked = lora_grads(weighted, batch)
    # the same loss by hand: cross-entropy over the answer, decision tokens weighted 5, on the same
    # weights with the hook inert (no token marked)
    weighted._set_batch(batch["input_ids"], torch.full_like(batch["labels"], -100))
    model = weighted.model
    model.zero_grad()
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    targets = batch["labels"][:, 1:]
    per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100, reduction="none")
    weights = 1 + 4 * positions[:, :-1].float()
    ((per_token * weights).sum() / (targets != -100).sum()).backward()
    by_hand = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    assert hooked.keys() == by_hand.keys() and hooked
    for name in hooked:
        torch.testing.assert_close(hooked[name], by_hand[name], rtol=1e-4, atol=1e-6, msg=name)
    plain = lora_grads(trainer_for(tiny_model, example, 1.0)[0], batch)
    assert any(not torch.allclose(plain[n], hooked[n], rtol=1e-3) for n in hooked)  # the weight changed something


def test_a_tokenizer_whose_labels_share_a_first_token_is_refused():
    from fastvista.train.label_weight import decision_tokens

    class OneLetter:  # every label starts with the same token
        def get_vocab(self):
            return {"|": 0, "X": 1}

        def convert_tokens_to_string(self, tokens):
            return "".join(tokens)

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [0, 1, 1]}

    with pytest.raises(ValueError, match="same first token"):
        decision_tokens(OneLetter())


def test_teacher_forced_label_accuracy_reads_each_claims_decision(tmp_path, tiny_model):
    """A model whose final norm is zero gives every token the same logit, so it ranks first the
    label whose first token has the lowest id: its accuracy is that label's share of the claims."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fastvista.train.label_accuracy import forced_label_accuracy
    from fastvista.train.label_weight import decision_tokens

    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        base.model.norm.weight.zero_()
    base.save_pretrained(tmp_path / "flat")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.save_pretrained(tmp_path / "flat")
    get_peft_model(base, LoraConfig(r=4, target_modules="all-linear")).save_pretrained(tmp_path / "adapter")
    examples = [e for i in range(3) for e in training_examples(drive(museum_dialogue(i), TeacherConfig(), _backend()), StudentFormat(history_turns=8, max_store_claims=64))]

    report = forced_label_accuracy(str(tmp_path / "adapter"), examples, base=str(tmp_path / "flat"))
    lines = [l for e in examples for l in e["completion"][0]["content"].splitlines() if " | " in l]
    truth = [l.rsplit(" | ", 1)[1] for l in lines]
    firsts = decision_tokens(tokenizer).firsts
    lowest = firsts[min(firsts)]
    assert report["claims"] == len(lines) and report["teacher_labels"] == {l: truth.count(l) for l in set(truth)}
    assert report["chosen"] == {lowest: len(lines)}
    assert report["accuracy"] == round(truth.count(lowest) / len(lines), 4)


@pytest.mark.parametrize("style", ["coded", "worded"])
def test_in_a_short_answer_the_first_token_of_the_label_is_the_decision(tiny_model, example, style):
    """One-letter labels or short label words: the first token after each bar decides the claim,
    and only it is weighed."""
    import torch
    from transformers import AutoTokenizer

    from fastvista.single_pass import parse_output, render_target
    from fastvista.train.label_weight import decision_positions, decision_tokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    claims = parse_output(example["completion"][0]["content"])
    answer = render_target(claims, style)
    decisions = decision_tokens(tokenizer, style)
    firsts = decisions.firsts
    assert sorted(firsts.values()) == sorted(label.value for label in Label)
    prompt = tokenizer("[TURN] a turn | with a bar\n", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + tokenizer(answer, add_special_tokens=False)["input_ids"]])
    labels = torch.tensor([[-100] * len(prompt) + ids[0, len(prompt):].tolist()])
    positions = decision_positions(ids, labels, decisions)
    decided = [firsts[t] for t in ids[0][1:][positions[0][:-1]].tolist()]
    assert decided == [c.label.value for c in claims] and len(claims) > 1
