# Two commands on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Pinned and installed first, so the trainer extra does not pull a CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: venv demo test proto bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q '$(TORCH)'
	$(PY) -m pip install -q -e '.[trainer,dev,unity]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m simbridge.trainer.demo

test: $(STAMP)
	$(PY) -m pytest -q

proto: $(STAMP)
	$(PY) tools/gen_proto.py

bench: $(STAMP)
	$(PY) bench/throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
