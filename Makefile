# Every target creates .venv when it is missing; a second run installs nothing.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(subst =,_,$(subst <,_,$(subst >,_,$(TORCH))))
PYTEST_ARGS ?=
# The supported torch range's ends (pyproject.toml, functd._torch.OLDEST/NEWEST_TESTED)
# and the tests CI runs on them (`.ci/run`): the areas that meet torch's private APIs
# (fd.jit and inductor, the loops' higher-order ops, vmap, functd.random's kernels,
# torch.compile, the optimizers, the HF models, DTensor checkpoints); the whole suite
# runs on TORCH.
OLDEST_TORCH ?= torch==2.13.0
NEWEST_TORCH ?= torch==2.14.1
MATRIX_TESTS ?= tests/test_torch_room.py tests/test_jit.py tests/test_loops.py \
	tests/test_loops_forms.py tests/test_lax_scan.py tests/test_while_loop.py \
	tests/test_vmap.py tests/test_random.py tests/test_random_vmap.py tests/test_keyed_random.py \
	tests/test_compile.py tests/test_optim.py tests/test_optim_combinators.py \
	tests/test_optim_laws.py tests/test_hf_models.py tests/test_distributed_checkpoint.py

.PHONY: demo examples test test-oldest test-newest test-newest-pinned bench gpu-check lint format clean venv docs typecheck wheel-check wheel

venv: $(STAMP)

# The install step also compiles functd's C extensions (functd/_fused_ext.c,
# functd/_td/_alloc_ext.c, see setup.py): it reruns when any of them changes.
$(STAMP): pyproject.toml setup.py functd/_fused_ext.c functd/_td/_alloc_ext.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[dev,interop,models]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# About 25 s on a quiet 2-core machine once .venv exists (README, "Two commands"); the
# longer examples run under `make examples`.
demo: $(STAMP)
	@echo "== make demo: 4 examples, about 25 s on a quiet 2-core CPU (more when it is busy)"
	@echo "   1. examples/tutorial.py        modules as pure functions, the runtime table"
	@echo "                                   (eager and torch.compile), a keyed probabilistic policy"
	@echo "   2. examples/ensembles.py       16 MLPs in one fd.vmap: equal to a loop, and the speed"
	@echo "   3. examples/train_ensemble.py  8 MLPs trained at once by one vmapped step"
	@echo "   4. examples/train_regression.py  a short run of a training step compiled with fd.jit"
	@echo "   (make examples: the longer ones)"
	@echo "== 1/4 examples/tutorial.py"
	@QUICK=1 $(BIN)/python examples/tutorial.py
	@echo "== 2/4 examples/ensembles.py"
	@$(BIN)/python examples/ensembles.py
	@echo "== 3/4 examples/train_ensemble.py"
	@QUICK=1 $(BIN)/python examples/train_ensemble.py
	@echo "== 4/4 examples/train_regression.py (fd.jit)"
	@QUICK=1 JIT=1 $(BIN)/python examples/train_regression.py

# The longer examples, full size (README, "Two commands", gives each one's time).
examples: $(STAMP)
	@echo "== make examples: 7 examples, about a minute on a quiet 2-core CPU"
	$(BIN)/python examples/tutorial.py
	$(BIN)/python examples/train_regression.py
	$(BIN)/python examples/train_ensemble.py
	$(BIN)/python examples/train_policy.py
	$(BIN)/python examples/finetune_hf.py
	$(BIN)/python examples/ppo_agents.py --agents 4 --seed 0 --no-progress
	$(BIN)/torchrun --nproc-per-node 2 examples/train_data_parallel.py

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The suite (PYTEST_ARGS="$(MATRIX_TESTS) ..." for CI's subset) on the oldest supported
# torch and on the newest tested one, each in a venv of its own (.venv-oldest,
# .venv-newest: CUDA builds of several GB on x86_64, installed once).
test-oldest:
	$(MAKE) test VENV=.venv-oldest TORCH="$(OLDEST_TORCH)" PYTEST_ARGS="$(PYTEST_ARGS)"

test-newest-pinned:
	$(MAKE) test VENV=.venv-newest TORCH="$(NEWEST_TORCH)" PYTEST_ARGS="$(PYTEST_ARGS)"

# The torch spec each target installs (.ci/run names it in its lines)
print-torch-test:
	@echo "$(TORCH)"
print-torch-test-oldest:
	@echo "$(OLDEST_TORCH)"
print-torch-test-newest-pinned:
	@echo "$(NEWEST_TORCH)"

# The suite against the newest torch pip serves here, in a venv of its own (.venv-newest:
# a CUDA build of several GB on x86_64), so a new torch release is one command from a
# verdict. Each run asks pip again (--upgrade), reinstalls functd there, runs the suite.
test-newest:
	test -x .venv-newest/bin/python || $(PYTHON) -m venv .venv-newest
	.venv-newest/bin/python -m pip install -q --disable-pip-version-check --upgrade torch
	rm -f .venv-newest/.installed-*
	$(MAKE) test VENV=.venv-newest TORCH=torch PYTEST_ARGS="$(PYTEST_ARGS)"

bench: $(STAMP)
	for f in $$(ls benchmarks/*.py | grep -v gpu_check); do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# The one prepared GPU run of issue 40 (<= 8 min, benchmarks/gpu_check.py): the CUDA tests,
# then issue 40's rows and targets, as gpu-check.json and gpu-check.md in $OUT when set, else
# gpu-check-out/; without CUDA it says so. GPU_PYTHON=python3: a Python that already has a
# CUDA torch and functd's dependencies (a lent machine's image: no venv, no network; the C
# extensions are built in place when it can, functd runs without them otherwise).
# GPU_CHECK_ARGS=--cpu: every step tiny on the CPU (the plumbing).
GPU_PYTHON ?=
GPU_CHECK_ARGS ?=
gpu-check:
ifeq ($(GPU_PYTHON),)
	$(MAKE) venv
	$(BIN)/python benchmarks/gpu_check.py $(GPU_CHECK_ARGS)
else
	-$(GPU_PYTHON) setup.py -q build_ext --inplace
	$(GPU_PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)
endif

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m mypy

# mypy over functd/ (config: [tool.mypy] in pyproject.toml; notes/docs.md, "Types")
typecheck: $(STAMP)
	$(BIN)/python -m mypy

# The documentation site, built strictly into site/ (a broken link, a missing API name or
# a failing example fails it). It needs only torch, the `docs` extra and the `models` extra
# (the HF guide runs transformers; the files guide, safetensors), not the test tools: on a
# fresh clone it installs just those, so `make docs` alone stays well under two minutes.
# A later `make test` adds the rest to the same .venv.
DOCS_STAMP := $(VENV)/.installed-docs-$(subst =,_,$(subst <,_,$(subst >,_,$(TORCH))))
$(DOCS_STAMP): pyproject.toml setup.py functd/_fused_ext.c functd/_td/_alloc_ext.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[docs,models]"
	rm -f $(VENV)/.installed-docs-*
	touch $(DOCS_STAMP)

# The files to publish, in dist/: the sdist and one wheel per platform for every CPython
# >= 3.10 (abi3), repaired by auditwheel to its manylinux tag, twine-checked, with no C
# source inside and no symbol outside the stable ABI (tools/check_wheel.py --build; about
# 40 s). `twine upload dist/*` publishes them.
wheel: $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[release]"
	rm -f dist/functd-*
	$(BIN)/python tools/check_wheel.py --build dist

# Build the sdist and wheel, twine-check them, install the wheel in a fresh venv and run
# the README there (tools/check_wheel.py; about 2.5 minutes with pip's cache warm).
wheel-check: $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[release]"
	$(BIN)/python tools/check_wheel.py

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .ruff_cache .mypy_cache .hypothesis
	rm -f functd/*.so functd/*.pyd functd/_td/*.so functd/_td/*.pyd
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
