# The two commands: `make demo` and `make test`. Both build .venv in the repo root from PyPI
# (MPI included: mpi4py with the mpich wheel); only a C compiler is assumed. The package is
# installed editable, so the extension is also built in place and the source tree imports.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
MPI     ?= mpich
RANKS   ?= 2
SOURCES := $(wildcard native/include/*.h native/src/*.c native/src/*.h native/binding/*.c) \
           setup.py pyproject.toml

.PHONY: demo test bench install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python $(SOURCES) $(wildcard collectives/*.py collectives/*/*.py pooltensor/*.py)
	$(BIN)/pip install -q "numpy>=1.24" "msgpack>=1.0" "mpi4py>=4.0" $(MPI) \
	    pytest pytest-timeout hypothesis matplotlib jax ml_dtypes "setuptools>=77" wheel
	$(BIN)/pip install -q --no-build-isolation --no-deps -e .
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/quickstart.py
	$(BIN)/python examples/servers_demo.py
	$(BIN)/python -m collectives.launch -n $(RANKS) examples/windows_demo.py

test: $(STAMP)
	cd tests && ../$(BIN)/python -m pytest -q -p no:cacheprovider

# What the benchmarks compare against, beyond MPI and numpy: gloo, through torch.distributed
# (no lighter binding installs: pygloo has no wheel for current Pythons). Only torch's CPU-only
# build (a 190 MB wheel), where pip can find one; PyPI's own Linux wheels pull several GB of
# CUDA libraries, so without a CPU wheel the gloo column is skipped (bench/collectives.py says so).
TORCH   ?= torch==2.13.0+cpu
BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP)
	@if $(BIN)/pip install -q "$(TORCH)"; then touch $@; else \
	    echo "make bench: $(TORCH) could not be installed: bench/collectives.py runs without gloo"; fi

bench: $(BENCH_STAMP)
	$(BIN)/mpiexec -n 2 $(BIN)/python bench/rma.py
	$(BIN)/mpiexec -n 2 $(BIN)/python bench/collectives.py
	$(BIN)/python bench/pool.py
	$(BIN)/python bench/ops.py
	$(BIN)/mpiexec -n 2 $(BIN)/python bench/ops.py
	$(BIN)/python bench/tcp.py

clean:
	rm -rf $(VENV) build *.egg-info collectives/_native*.so
