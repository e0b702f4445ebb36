# Peer baselines (benchmarks/baselines): include from the Makefile with
#   include benchmarks/baselines/distdgl.mk
#
# DistDGL (DGL 2.1.0's distributed runtime) runs in the project's .venv (torch 2.13):
# no second virtualenv is needed. `distdgl-env` checks that it imports and
# whether per-machine /dev/shm isolation (unshare, root) is available, then runs a
# two-trainer smoke launch (about 30 s).
#
#   make distdgl-env                     check the runtime
#   make distdgl                         DistDGL time to target at DISTDGL_PROCS processes
#                                        (synthetic graph of DISTDGL_NODES vertices)
#   make distdgl DISTDGL_GRAPH=g.bin DISTDGL_TARGET=0.8
#                                        the same on a dgl.save_graphs file, read as
#                                        `scalegnn train --data g.bin` reads it
#   make peers                           GraphSAINT-node and GraphSAGE sweeps (Cora, synthetic)
#
# OMP_WAIT_POLICY=passive: torch and DGL each load their own libgomp; with active waiting
# their threads spin against each other (see benchmarks/baselines/__init__.py).

DISTDGL_PY ?= $(if $(PY),$(PY),.venv/bin/python)
DISTDGL_PROCS ?= 1 2 4 8
DISTDGL_SEEDS ?= 0 1 2
DISTDGL_NODES ?= 50000
DISTDGL_TARGET ?= 0.87
DISTDGL_EPOCHS ?= 15
DISTDGL_TOPOLOGY ?= auto
DISTDGL_TIMEOUT ?= 1800
DISTDGL_GRAPH ?=
DISTDGL_OUT ?= $(if $(DISTDGL_GRAPH),runs/distdgl-$(basename $(notdir $(DISTDGL_GRAPH))).json,benchmarks/results/baselines_distdgl.json)
DISTDGL_ENV := OMP_WAIT_POLICY=passive PYTHONPATH=$(CURDIR)

.PHONY: distdgl-env distdgl peers

distdgl-env:
	$(DISTDGL_ENV) $(DISTDGL_PY) -m benchmarks.baselines.distdgl check

distdgl:
	mkdir -p $(dir $(DISTDGL_OUT))
	$(DISTDGL_ENV) $(DISTDGL_PY) -m benchmarks.baselines.distdgl bench \
		--procs $(DISTDGL_PROCS) --seeds $(DISTDGL_SEEDS) --num-nodes $(DISTDGL_NODES) \
		$(if $(DISTDGL_GRAPH),--graph $(DISTDGL_GRAPH)) \
		--target $(DISTDGL_TARGET) --max-epochs $(DISTDGL_EPOCHS) --topology $(DISTDGL_TOPOLOGY) \
		--timeout $(DISTDGL_TIMEOUT) --out $(DISTDGL_OUT)

peers:
	$(DISTDGL_ENV) $(DISTDGL_PY) -m benchmarks.baselines.run_peers --dataset cora
	$(DISTDGL_ENV) $(DISTDGL_PY) -m benchmarks.baselines.run_peers --dataset synthetic
