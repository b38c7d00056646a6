"""The engine-start benchmark's checks and table (the engines themselves: tests/test_engines.py, slow)."""

import pytest


def test_engine_start_refuses_an_unknown_mode_before_starting_anything(tmp_path):
    from fastvista.evaluation.engine_start import main, table

    with pytest.raises(ValueError, match="unknown engine mode"):
        main("m", "x.jsonl", ["compiled", "warp"], 1, tmp_path, 1 << 30)
    assert not (tmp_path / "engine_start.json").exists()
    assert "| eager | 2 | float32 | 12.5 | 3.0 | 40.1 | 16 |" in table([{"mode": "eager", "repeat": 2, "dtype": "float32", "start_s": 12.5, "answer_s": 3.0,
                                                              "tokens_per_s": 40.1, "requests": 16}])
