# The two commands: `make demo` and `make test`. Both build .venv in the repo root from PyPI
# (MPI included: mpi4py with the mpich wheel); only a C compiler is assumed. The package is
# installed editable, so the extension is also built in place and the source tree imports.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
MPI     ?= mpich
RANKS   ?= 2
SOURCES := $(wildcard native/include/*.h native/src/*.[ch] native/src/*/*.[ch] \
                      native/src/*/*/*.[ch] native/binding/*.[ch] native/binding/*/*.[ch]) \
           setup.py pyproject.toml

.PHONY: demo test test-posix bench install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# distributed has a floor: each of its releases pins one dask release, and when PyPI has a dask
# newer than the last distributed, pip would otherwise pair the new dask with a years-old
# distributed (2021.4.1, which does not import with it) instead of taking both one step back.
$(STAMP): $(BIN)/python $(SOURCES) $(wildcard collectives/*.py collectives/*/*.py pooltensor/*.py pooltensor/*/*.py)
	$(BIN)/pip install -q "numpy>=1.24" "msgpack>=1.0" "cloudpickle>=2.0" "threadpoolctl>=3.1" "mpi4py>=4.0" $(MPI) \
	    "dask[array]>=2024.1" "distributed>=2024.1" dask-mpi pytest pytest-timeout hypothesis matplotlib jax ml_dtypes \
	    "setuptools>=77" wheel prometheus_client rich tqdm safetensors
	$(BIN)/pip install -q --no-build-isolation --no-deps -e .
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/quickstart.py
	$(BIN)/python examples/servers_demo.py
	$(BIN)/python examples/dask_demo.py
	$(BIN)/python -m collectives.launch -n $(RANKS) examples/windows_demo.py
	$(BIN)/mpiexec -n 2 $(BIN)/python examples/jax_dp.py --steps 60

test: $(STAMP)
	cd tests && ../$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25
	$(MAKE) test-posix

# The posix profile (what macOS builds), built a second time into build/posix/pkg next to a
# copy of the packages, never over the linux build in place, and tested there (part of `test`,
# after the linux run): the modules that exercise the platform layer and its symbol test
# (test_native_posix), and of the windows, collectives, pool and tcp modules the cases that
# reach the native layer with 2 and 3 ranks. Left to the linux run: our launcher's 1-, 3- and
# 4-rank runs (but the collectives matrix's 3 ranks, which runs under our launcher only) and
# mpiexec's 1- and 4-rank ones, JAX, the mismatch checks (Python above the
# native layer), and the collectives and secret-file runs over tcp, to keep CI within budget.
POSIX_PKG   := build/posix/pkg
POSIX_TESTS := test_native_posix.py test_windows.py test_collectives.py test_pool.py test_tcp.py \
               test_tcp_stalls.py test_channel_native.py \
               test_stats.py
POSIX_SKIP  := not launch-1 and not (launch-3 and not every_collective) and not launch-4 and \
               not mpiexec-1 and not mpiexec-4 and not jax and not mismatch and not dtype_aliases and \
               not zero_dim and not collectives_over_tcp and not secret_file_and_listen

$(POSIX_PKG)/.built: $(STAMP) $(SOURCES)
	rm -rf $(POSIX_PKG) && mkdir -p $(POSIX_PKG)
	cp -r collectives pooltensor $(POSIX_PKG)/
	rm -f $(POSIX_PKG)/collectives/_native*.so
	POOLTENSOR_NATIVE=posix $(BIN)/python setup.py -q build_ext --build-lib $(POSIX_PKG) \
	    --build-temp build/posix/tmp
	touch $@

test-posix: $(POSIX_PKG)/.built
	cd tests && PYTHONPATH=../$(POSIX_PKG) POOLTENSOR_EXPECT_NATIVE=posix \
	    ../$(BIN)/python -m pytest -q -p no:cacheprovider -k "$(POSIX_SKIP)" $(POSIX_TESTS)

# The kernels built for aarch64 and run under qemu, against x86-64 bit for bit (part of `test`
# too; skipped without aarch64-linux-gnu-gcc and qemu-aarch64).
.PHONY: test-arm64
test-arm64: $(STAMP)
	cd tests && ../$(BIN)/python -m pytest -q -p no:cacheprovider -rs test_kernels_arm64.py

# What the benchmarks compare against, beyond MPI and numpy: gloo, through torch.distributed
# (no lighter binding installs: pygloo has no wheel for current Pythons). Only torch's CPU-only
# build (a 190 MB wheel), where pip can find one; PyPI's own Linux wheels pull several GB of
# CUDA libraries, so without a CPU wheel the gloo column is skipped (bench/collectives.py says so).
TORCH   ?= torch==2.13.0+cpu
BENCH_STAMP := $(VENV)/.bench-installed

# mpi4jax for bench/jax.py: PyPI has only its source, built with the venv's mpicc; its setup
# builds a CUDA bridge wherever it finds an nvcc, so the build runs with a PATH without one.
$(BENCH_STAMP): $(STAMP)
	@if $(BIN)/pip install -q "$(TORCH)"; then touch $@; else \
	    echo "make bench: $(TORCH) could not be installed: bench/collectives.py runs without gloo"; fi
	@env PATH=$(abspath $(BIN)):/usr/bin:/bin MPI4JAX_BUILD_MPICC=$(abspath $(BIN))/mpicc \
	    $(BIN)/pip install -q mpi4jax || \
	    echo "make bench: mpi4jax could not be built: bench/jax.py runs without it"

bench: $(BENCH_STAMP)
	$(BIN)/python -m collectives.launch -n 2 bench/stats.py
	$(BIN)/mpiexec -n 2 $(BIN)/python bench/rma.py
	$(BIN)/mpiexec -n 2 $(BIN)/python bench/collectives.py
	$(BIN)/mpiexec -n 2 $(BIN)/python bench/jax.py
	$(BIN)/python bench/pool.py
	$(BIN)/python bench/ops.py
	$(BIN)/mpiexec -n 2 $(BIN)/python bench/ops.py
	$(BIN)/python bench/plain.py
	$(BIN)/python bench/replicas.py
	$(BIN)/python bench/arrayapi.py
	$(BIN)/python bench/tcp.py
	$(BIN)/python bench/dask.py

clean:
	rm -rf $(VENV) build *.egg-info collectives/_native*.so
