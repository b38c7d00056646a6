"""Kill the teacher with SIGKILL mid-run, run the same command again: nothing lost, nothing
duplicated, no cached call paid again."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from fastvista.records_io import write_jsonl
from tests.fake_openai import FakeOpenAI
from tests.test_pipeline import museum_dialogue


def cache_size(path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT COUNT(*) FROM completions").fetchone()[0]


@pytest.mark.parametrize("schedule", ["waves", "continuous"])
def test_killed_run_resumes_without_loss_duplication_or_repeated_calls(tmp_path, schedule):
    inputs = tmp_path / "in.jsonl"
    write_jsonl(inputs, [museum_dialogue(i) for i in range(12)])
    out, cache = tmp_path / "run", tmp_path / "cache.sqlite"
    config = tmp_path / "synth.yaml"
    with FakeOpenAI(delay=0.03) as server:
        config.write_text(
            f"backend: {{kind: openai, model: teacher, base_url: '{server.url}', cache: '{cache}', concurrency: 2}}\n"
            f"max_active: 2\nschedule: {schedule}\ndata: {{source: jsonl}}\n"
        )
        cmd = [sys.executable, "-m", "fastvista.cli", "synth", "-c", str(config), "-i", str(inputs), "-o", str(out), "--quiet"]
        first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        labelled = out / "labelled.jsonl"
        deadline = time.time() + 60
        while time.time() < deadline and (not labelled.exists() or len(labelled.read_text().splitlines()) < 1):
            time.sleep(0.02)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        written_at_kill = len(labelled.read_text().splitlines())
        cached_at_kill, received_at_kill = cache_size(cache), sum(server.received.values())
        assert 1 <= written_at_kill < 12, "the kill must land mid-run"

        second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert second.returncode == 0, second.stderr
    ids = [json.loads(l)["id"] for l in labelled.read_text().splitlines()]
    assert sorted(ids) == sorted(f"d{i}" for i in range(12))  # none lost, none twice
    unique_calls = len(server.received)
    assert cache_size(cache) == unique_calls
    # the second run sent exactly the calls the cache did not hold
    assert sum(server.received.values()) - received_at_kill == unique_calls - cached_at_kill
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dialogues"] == 12 and summary["this_run"]["resumed"] == written_at_kill
    assert summary["training_examples"] == 36
    assert len((out / "train.jsonl").read_text().splitlines()) == 36
