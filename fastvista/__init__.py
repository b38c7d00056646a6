"""fastvista: claim-level factuality scoring of knowledge-grounded dialogues, fast."""

__version__ = "0.1.0"
