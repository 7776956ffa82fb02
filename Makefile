# Two commands on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Pinned and installed first, so the trainer extra does not pull a CUDA build.
TORCH  ?= torch==2.13.0

# The C++ SDK, the Gazebo layer and the MuJoCo simulator build with Debian's packages.
# ccache: the tests' C++ build (tests/conftest.py) compiles only what changed since the last run on this machine.
CPP_DEBS := cmake g++ pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev ccache

.PHONY: venv demo test proto bench clean cpp-deps

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q '$(TORCH)'
	$(PY) -m pip install -q -e '.[trainer,dev,unity,mujoco,datasets,sb3]'
	touch $(STAMP)

# DEMO_ARGS: the demo's options (python -m simbridge.trainer.demo --help), e.g. DEMO_ARGS="--seconds 60".
demo: $(STAMP)
	$(PY) -m simbridge.trainer.demo $(DEMO_ARGS)

# Installs CPP_DEBS where they are missing and this is root (CI is); elsewhere the C++ tests
# skip and say which packages to install.
cpp-deps:
	@if ! dpkg -s $(CPP_DEBS) >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing $(CPP_DEBS)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(CPP_DEBS) >/dev/null \
	      || echo "warning: could not install $(CPP_DEBS): the C++ tests will skip"; \
	  else \
	    echo "note: the C++ tests skip without $(CPP_DEBS): sudo apt-get install $(CPP_DEBS)"; \
	  fi; \
	fi

# The suite on TEST_WORKERS pytest-xdist workers: its tests wait on real processes and timers about half
# their time, so 3 workers fill 2 cores. A test file is one worker's (tests/conftest.py says why).
# TEST_WORKERS=0 runs it in this one process.
# The suite starts some 300 Python processes: each would compile the project's modules again where
# the environment says PYTHONDONTWRITEBYTECODE (this VM's does), so the suite runs without it.
TEST_WORKERS ?= 3
test: $(STAMP) cpp-deps
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

proto: $(STAMP)
	$(PY) tools/gen_proto.py

bench: $(STAMP)
	$(PY) bench/throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
