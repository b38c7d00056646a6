"""Agreement with the teacher, accuracy against human labels, baselines and speed benchmarks."""
