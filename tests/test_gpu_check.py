"""``make gpu-check`` here, where no GPU is usable, and its checks run on the CPU.

- ``make gpu-check`` with CUDA unavailable exits 3, says why on stderr and in the report;
  ``GPU_EXPECTED=0`` (through an interpreter named by ``PYTHON``) writes a skipped report
  and exits 0.
- Every check runs on the CPU device where that makes sense (the CPU against itself,
  small sizes): the report they make has exactly the fields ``docs/gpu-check.md``
  shows; a fused tail that never compiles fails its check, quoting the compiler error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import yaml
from dgl_scalegnn.train import gpu_check
from tests.helpers import ROOT

#: The large run's preset shrunk for the CPU (its generator settings kept).
SMALL_PRESET_NODES = 3000


def _make_gpu_check(tmp_path, *variables: str, env: dict[str, str] | None = None):
    report = tmp_path / "report.json"
    result = subprocess.run(
        ["make", "--no-print-directory", "gpu-check", f"GPU_CHECK_REPORT={report}", *variables],
        cwd=ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, json.loads(report.read_text())


def _documented_report() -> dict:
    text = (ROOT / "docs" / "gpu-check.md").read_text()
    return json.loads(re.search(r"```json\n(.*?)```", text, re.DOTALL).group(1))


def _same_fields(report: dict, documented: dict) -> None:
    """Top-level, environment and check-entry fields as documented; the figures too of
    every check that ran."""
    assert report.keys() == documented.keys()
    assert report["environment"].keys() == documented["environment"].keys()
    assert report["checks"].keys() == documented["checks"].keys() == gpu_check.CHECKS.keys()
    for name, entry in report["checks"].items():
        assert entry.keys() - {"traceback"} == documented["checks"][name].keys(), name
        if entry["status"] != "skipped" and "traceback" not in entry:
            assert entry["figures"].keys() == documented["checks"][name]["figures"].keys(), name


def test_without_a_gpu_it_refuses_loudly(tmp_path):
    result, report = _make_gpu_check(tmp_path)
    # make exits 2 for any failed recipe, naming the script's status
    assert result.returncode != 0 and f"Error {gpu_check.NO_GPU}" in result.stderr, result.stderr
    assert "no usable GPU" in result.stderr and "GPU_EXPECTED=0" in result.stderr
    if torch.version.cuda is None:
        assert f"torch {torch.__version__} has no CUDA" in result.stderr
    assert report["status"] == "no-gpu" and report["gpu_expected"] is True
    assert report["reason"].startswith("no usable GPU: ") and report["reason"] in result.stderr
    assert {e["status"] for e in report["checks"].values()} == {"skipped"}
    assert {e["reason"] for e in report["checks"].values()} == {report["reason"]}
    _same_fields(report, _documented_report())


def test_no_gpu_expected_writes_a_skipped_report(tmp_path):
    result, report = _make_gpu_check(tmp_path, "GPU_EXPECTED=0", env={"PYTHON": sys.executable})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"{sys.executable} -m dgl_scalegnn.train.gpu_check")
    assert report["status"] == "skipped" and report["gpu_expected"] is False
    assert report["environment"]["torch"] == torch.__version__
    _same_fields(report, _documented_report())


def _failing_compile(function, **options):
    def compiled(*args, **kwargs):
        raise RuntimeError("no compiler in this test")

    return compiled


@pytest.fixture(scope="module")
def cpu_report() -> dict:
    """Every check on the CPU at small sizes, torch.compile failing at every call."""
    preset = yaml.safe_load((ROOT / gpu_check.LARGE_CONFIG).read_text())
    preset["data"]["synthetic"]["num_nodes"] = SMALL_PRESET_NODES
    preset["sampling"]["batch_size"] = SMALL_PRESET_NODES // 10
    checks = {
        "one_rank_vs_cpu": gpu_check.one_rank_vs_cpu,
        "chunked_eval": lambda device: gpu_check.chunked_eval(device, 3000, 97),
        "host_syncs": gpu_check.host_syncs,
        "large_run": lambda device: gpu_check.large_run(device, preset, steps=7),
        "torchrun_grid": lambda device: gpu_check.torchrun_grid(1),
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "compile", _failing_compile)
        entries = gpu_check.run_checks(torch.device("cpu"), checks)
    report = gpu_check.make_report("failed", None, True, gpu_check.environment(), entries, 0.0)
    return json.loads(json.dumps(report))


def test_the_report_has_the_documented_fields(cpu_report):
    _same_fields(cpu_report, _documented_report())
    assert cpu_report["format"] == gpu_check.REPORT_FORMAT


def test_a_fused_tail_that_never_compiles_fails_its_check(cpu_report):
    entry = cpu_report["checks"]["one_rank_vs_cpu"]
    assert entry["status"] == "failed"
    assert "no compiled tail kernel ran" in entry["reason"]
    assert "no compiler in this test" in entry["reason"]  # the fallback's logged cause
    figures = entry["figures"]
    calls = figures["tail_calls"]
    assert calls["compiled"] == 0 and calls["native"] + calls["eager"] > 0
    # the rest of the comparison still holds: the eager tail on both sides
    assert figures["max_relative_difference"] <= gpu_check.LOSS_TOLERANCE
    assert len(figures["losses_device"]) == 3


def test_the_checks_run_on_the_cpu(cpu_report):
    checks = cpu_report["checks"]
    assert {name: e["status"] for name, e in checks.items()} == {
        "one_rank_vs_cpu": "failed",
        "chunked_eval": "passed",
        "host_syncs": "skipped",
        "large_run": "passed",
        "torchrun_grid": "skipped",
    }
    evaluation = checks["chunked_eval"]["figures"]
    assert evaluation["chunks"] == 3 * 31 and evaluation["logits_relative_error"] <= 1e-4
    assert evaluation["accuracy_device"] == evaluation["accuracy_cpu"]
    large = checks["large_run"]["figures"]
    assert large["num_nodes"] == SMALL_PRESET_NODES and large["steps"] == 7
    assert large["seconds_per_step"] > 0 and large["eval_s"] > 0
    assert {"spmm", "gemm"} <= large["breakdown_s"].keys()
    assert "this machine has 1" in checks["torchrun_grid"]["reason"]
    assert "CUDA only" in checks["host_syncs"]["reason"]
