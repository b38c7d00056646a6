"""The baselines the papers compare with: Q2, FActScore-style and LLM-as-Judge. Each scores a
dialogue through the same state-machine interface as the teacher and the student."""
