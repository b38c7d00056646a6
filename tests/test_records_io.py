import json

import pytest
from typer.testing import CliRunner

from fastvista.cli import app
from fastvista.records_io import RecordError, read_dialogues

GOOD = {"id": "ok", "turns": [{"role": "user", "text": "hi"}, {"role": "assistant", "text": "Hello.", "reference": "r"}]}


def write(tmp_path, lines: list[bytes]):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


BAD = [
    (b'{"id": "x", "turns": [', None, "invalid JSON"),
    (json.dumps({"id": "x"}).encode(), "turns", "Field required"),
    (json.dumps({"id": "x", "turns": [{"role": "wizard", "text": "a"}]}).encode(), "turns.0.role", "'user' or 'assistant'"),
    (b'{"id": "x", "turns": [{"role": "user", "text": "caf\xe9"}]}', None, "not UTF-8"),
    (json.dumps({"id": "x", "turns": [{"role": "user", "text": "a", "colour": 1}]}).encode(), "turns.0.colour", "Extra inputs"),
]


@pytest.mark.parametrize("line,field,reason", BAD)
def test_bad_lines_name_file_line_and_field(tmp_path, line, field, reason):
    path = write(tmp_path, [json.dumps(GOOD).encode(), line])
    with pytest.raises(RecordError) as err:
        list(read_dialogues(path))
    e = err.value
    assert (e.path, e.line, e.field) == (str(path), 2, field)
    assert reason in e.reason and f"{path}:2" in str(e)


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(RecordError, match="no records"):
        list(read_dialogues(path))


def test_skip_bad_collects_every_bad_line_and_keeps_the_good_ones(tmp_path):
    path = write(tmp_path, [json.dumps(GOOD).encode()] + [b for b, _, _ in BAD] + [json.dumps({**GOOD, "id": "ok2"}).encode()])
    skipped = []
    good = [d.id for _, d in read_dialogues(path, skipped)]
    assert good == ["ok", "ok2"]
    assert [e.line for e in skipped] == [2, 3, 4, 5, 6]


def test_cli_convert_reports_skipped_records(tmp_path):
    path = write(tmp_path, [json.dumps(GOOD).encode(), BAD[2][0]])
    out = tmp_path / "out.jsonl"
    runner = CliRunner()
    stopped = runner.invoke(app, ["data", "convert", "jsonl", str(path), "-o", str(out)])
    assert stopped.exit_code == 2 and "in.jsonl:2" in stopped.output and "turns.0.role" in stopped.output
    went_on = runner.invoke(app, ["data", "convert", "jsonl", str(path), "-o", str(out), "--skip-bad"])
    assert went_on.exit_code == 0, went_on.output
    assert len(out.read_text().splitlines()) == 1
    [report] = [json.loads(l) for l in open(f"{out}.skipped.jsonl")]
    assert report["line"] == 2 and report["field"] == "turns.0.role"


def test_synth_stops_on_bad_input_or_skips_and_reports_it(tmp_path):
    from tests.fake_openai import FakeOpenAI

    path = write(tmp_path, [json.dumps(GOOD).encode(), BAD[1][0], BAD[3][0]])
    runner = CliRunner()
    with FakeOpenAI() as server:
        args = ["synth", "-i", str(path), "--source", "jsonl", "-o", str(tmp_path / "run"), "--quiet",
                "--set", "backend.kind=openai", "--set", "backend.model=teacher", "--set", f"backend.base_url={server.url}"]
        stopped = runner.invoke(app, args)
        assert stopped.exit_code == 2 and "in.jsonl:2" in stopped.output and "'turns'" in stopped.output
        went_on = runner.invoke(app, args + ["--skip-bad"])
    assert went_on.exit_code == 0, went_on.output
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["dialogues"] == 1 and summary["inputs_skipped"] == 2
    reports = [json.loads(l) for l in (tmp_path / "run/skipped.jsonl").read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in reports] == [(2, "turns"), (3, None)]
    assert "not UTF-8" in reports[1]["reason"]
