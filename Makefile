# Set-up: `make install`, then `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
NP ?= 4
GRID ?= 1x1x2x2
CONFIG ?= yaml/synthetic.yaml

.PHONY: install test test-gpu gpu-check run lint bench bench-scale bench-growth bench-eval bench-real bench-real-layers bench-real-gat clean

# torch first, pinned. On Linux PyPI's torch==2.13.0 is the CUDA 13 build (GBs, driver
# >= 580: docs/gpu.md); pip takes a CPU build (2.13.0+cpu) where its find-links or index
# offer one, or from TORCH_INDEX, e.g. make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
# The last line writes the start-up hook that makes plain `import dgl` work on this torch
# (dgl_scalegnn/_dgl.py says why).
TORCH_INDEX ?=
install:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "pip>=23"
	$(PIP) install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch==2.13.0
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps --no-build-isolation -e .
	$(PY) -c "from dgl_scalegnn._dgl import write_startup_hook; print(write_startup_hook())"

test: lint
	$(PY) -m pytest -q

# The CUDA smoke suite (tests/gpu): NCCL against gloo, one GPU against the CPU. Where
# CUDA is not usable it stops with exit 3 and says why.
test-gpu:
	SCALEGNN_TEST_GPU=1 $(PY) -m pytest -q -rs tests/gpu

# One unattended check of a GPU machine, at most about 5 minutes on one GPU: one JSON
# report (GPU_CHECK_REPORT; its fields in docs/gpu-check.md). The script exits 3 where
# no GPU is usable, saying why (make: "Error 3"), unless GPU_EXPECTED=0 (then the report
# says skipped), and 1 when a check fails. PYTHON=python3 runs it on that interpreter
# (the project installed there with pip install --no-deps), otherwise on the .venv.
GPU_EXPECTED ?= 1
GPU_CHECK_REPORT ?= gpu-check.json
GPU_CHECK_PY = $(if $(filter command line environment,$(origin PYTHON)),$(PYTHON),$(PY))
gpu-check:
	$(GPU_CHECK_PY) -m tests.gpu.check --out $(GPU_CHECK_REPORT) \
		$(if $(filter 0,$(GPU_EXPECTED)),--no-gpu-expected)

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The synthetic default on a 4-process grid through mpirun (NP, GRID, CONFIG overridable).
run:
	OMP_WAIT_POLICY=passive launch/mpirun.sh $(NP) $(GRID) $(CONFIG)

# Each bench target takes its settings from BENCH_ARGS (`make bench-growth BENCH_ARGS=--help`
# lists them), e.g. make bench BENCH_ARGS=--full for the full sizes of every benchmark.
BENCH_ARGS ?=

# The accuracy benchmark reads Cora's Planetoid files from SCALEGNN_DATA_ROOT; unset, it
# uses the copy the tests read (../shared/datasets beside the project).
bench: export SCALEGNN_DATA_ROOT ?= $(abspath ../shared/datasets)
bench:
	$(PY) -m benchmarks.run_all $(BENCH_ARGS)

# Accuracy against training seconds on the two 1M-vertex synthetic graphs, dgl_scalegnn
# (1 and 8 processes) against GraphSAINT-node, GraphSAGE and DistDGL; quick mode (the
# default) about 45 minutes on 2 cores, BENCH_ARGS=--full for 3 seeds and larger sweeps
# (also part of `make bench` then); --nodes N shrinks both graphs.
bench-scale:
	OMP_WAIT_POLICY=passive THP_MEM_ALLOC_ENABLE=1 $(PY) -m benchmarks.bench_scale $(BENCH_ARGS)

# How a step, an evaluation, memory per rank and preparation grow with the graph: the
# sparse preset at 1M, 3M and 10M vertices and the products-like one at 1M and 2.45M,
# ours (1 and 8 processes) beside GraphSAINT-node, GraphSAGE, DGL's full-graph forward
# and DistDGL (59-69 minutes on 2 cores; benchmarks/results/bench_growth.md, .png).
# BENCH_ARGS: --sizes, --budget, --work and --methods (benchmarks/bench_growth.py).
bench-growth:
	OMP_WAIT_POLICY=passive THP_MEM_ALLOC_ENABLE=1 $(PY) -m benchmarks.bench_growth $(BENCH_ARGS)

# Full-graph evaluation against DGL's full-graph forward on the same graph: our engine on
# the forward's own model (two SAGE-mean layers) and on the preset's, each in its own
# process with its peak memory (benchmarks/results/bench_eval.md; sparse 1M and 3M,
# products-like 1M; BENCH_ARGS: --sizes, --work, benchmarks/bench_eval.py).
bench-eval:
	OMP_WAIT_POLICY=passive THP_MEM_ALLOC_ENABLE=1 $(PY) -m benchmarks.bench_eval $(BENCH_ARGS)

# Every real graph of benchmarks/data/real: our defaults and the paper's model against DGL's
# GraphConv and SAGEConv recipes and GraphSAINT-node, 10 seeds (benchmarks/results/bench_real.md).
bench-real:
	OMP_WAIT_POLICY=passive $(PY) -m benchmarks.bench_real $(BENCH_ARGS)

# GraphSAGE-mean and GIN (model.conv) with our defaults against DGL's full-batch SAGEConv
# ('mean') and GINConv trainers, and the GCN pair, on Cora and Citeseer, 10 seeds
# (benchmarks/results/bench_real_layers.md).
bench-real-layers:
	OMP_WAIT_POLICY=passive $(PY) -m benchmarks.bench_real --name bench_real_layers \
	  --graphs cora citeseer --methods "ours, defaults" "DGL GraphConv" \
	  "ours SAGE, defaults" "DGL SAGEConv mean" "ours GIN, defaults" "DGL GINConv" $(BENCH_ARGS)

# GAT (model.conv: gat) with the published GAT recipe against DGL's GATConv trained with it,
# early stopping included, on Cora and Citeseer, 10 seeds (benchmarks/results/bench_real_gat.md).
bench-real-gat:
	OMP_WAIT_POLICY=passive $(PY) -m benchmarks.bench_real --name bench_real_gat \
	  --graphs cora citeseer --methods "ours GAT, GAT recipe" "DGL GATConv" $(BENCH_ARGS)

clean:
	rm -rf runs .pytest_cache

# Peer baselines (GraphSAINT-node, GraphSAGE, DistDGL): make peers / distdgl / distdgl-env
include benchmarks/baselines/distdgl.mk
