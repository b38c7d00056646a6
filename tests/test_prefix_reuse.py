"""The offline prefix-reuse count: common prefixes in whole KV blocks, per prompt layout."""

from fastvista.evaluation.prefix_reuse import LAYOUTS, common_prefix, prompts, reuse
from fastvista.protocol import drive
from fastvista.synth.pipeline import TeacherConfig, label_dialogue
from tests.scripted import ScriptedBackend
from tests.test_pipeline import museum_dialogue


def test_common_prefix_counts_whole_blocks_only():
    assert common_prefix([1, 2, 3, 4, 5], [1, 2, 3, 9], block=2) == 2
    assert common_prefix([1, 2, 3, 4], [1, 2, 3, 4, 5], block=2) == 4 and common_prefix([], [1], block=1) == 0


def test_each_layout_renders_every_section_once_and_reuse_is_counted_per_turn(tiny_model):
    from transformers import AutoTokenizer

    scored = [drive(label_dialogue(museum_dialogue(i), TeacherConfig()), ScriptedBackend()) for i in range(2)]
    for order, window in LAYOUTS.values():
        for messages in prompts(scored[0], order, window):
            user = messages[1]["content"]
            assert [user.index(h) for h in order] == sorted(user.index(h) for h in order)  # the layout's order
    report = reuse(scored, AutoTokenizer.from_pretrained(str(tiny_model)), block=1)
    turns = sum(len(s.turns) for s in scored)
    for name, row in report.items():
        assert row["turns"] == turns and 0 < row["reused_share"] < 1, name
    whole = report["history (all), store, reference, turn"]
    assert whole["prompt_tokens_per_turn"] >= report["history (8), store, reference, turn"]["prompt_tokens_per_turn"]
