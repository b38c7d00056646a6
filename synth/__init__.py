"""The teacher: VISTA's multi-step pipeline (decompose -> verify -> classify -> remember).

It labels dialogues claim by claim with a strong LLM and writes the student's training set.
"""
