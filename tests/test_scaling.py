"""The scaling curve's inputs: references cut or grown to a target length from other passages."""

from fastvista.evaluation.scaling import long_reference, scaling_sets
from fastvista.schema import Dialogue, Turn


def words(text: str) -> int:
    return len(text.split())


def test_a_reference_is_cut_at_a_sentence_or_grown_with_other_passages_only():
    own = "One two three four. Five six seven eight. Nine ten eleven twelve."
    assert long_reference(own, [], 5, words) == "One two three four. Five six seven eight."  # whole sentences up to the target
    pool = ["A b c d e.", own, "F g h i j.", "A b c d e.", "K l m. N o p."]
    grown = long_reference(own, pool, 24, words)
    assert grown.split("\n") == [own, "A b c d e.", "F g h i j.", "K l m."]  # itself and repeats never; the last one cut
    assert words(long_reference(own, pool, 1000, words)) == words(own) + 16  # the pool runs out: all of it, once


def test_each_target_keeps_every_dialogue_and_only_scored_references_change():
    dialogues = [Dialogue(id=f"d{i}", turns=[Turn(role="user", text="hi"),
                                             Turn(role="assistant", text="x", reference=f"Passage {i} has five words."),
                                             Turn(role="assistant", text="y", reference=f"Context {i} stays.", score=False)])
                 for i in range(3)]
    sets = scaling_sets(dialogues, [2, 12], words)
    assert [d.id for d in sets[12]] == ["d0#ref12", "d1#ref12", "d2#ref12"]
    for d, original in zip(sets[12], dialogues):
        reference = d.turns[1].reference
        assert reference.startswith(original.turns[1].reference) and words(reference) >= 12  # its own passage first
        assert d.turns[1].meta["reference_tokens"] == words(reference)
        assert d.turns[2].reference == original.turns[2].reference  # a context turn is left alone
    assert sets[2][0].turns[1].reference == "Passage 0 has five words."  # below its own length: the first sentence


def test_distractors_can_come_from_more_dialogues_than_are_scored():
    passages = [Dialogue(id=f"p{i}", turns=[Turn(role="assistant", text="x", reference=f"Other passage number {i} here.")]) for i in range(5)]
    one = [Dialogue(id="d", turns=[Turn(role="assistant", text="x", reference="Own passage.")])]
    [grown] = scaling_sets(one, [10], words, passages=passages + one)[10]
    assert grown.turns[0].reference.startswith("Own passage.") and "Other passage number" in grown.turns[0].reference
