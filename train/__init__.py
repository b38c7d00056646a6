"""The student: supervised fine-tuning of a LoRA adapter on the teacher's training set."""
