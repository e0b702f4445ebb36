"""``make gpu-check`` here, where no GPU is usable, and its checks run on the CPU.

- ``make gpu-check`` with CUDA unavailable exits 3, says why on stderr and in the report;
  ``GPU_EXPECTED=0`` (through an interpreter named by ``PYTHON``) writes a skipped report
  and exits 0.
- Every check runs on the CPU device where that makes sense (the CPU against itself,
  small sizes): the report they make has exactly the fields ``docs/gpu-check.md``
  shows; a fused tail that never compiles fails its check, quoting the compiler error.
- The report is written whatever fails: with DGL's import broken it says so as a failed
  fact, the others found; the documented import check imports DGL.
- TF32: the comparisons switch it off through torch's ``fp32_precision`` settings alone
  (the legacy ``allow_tf32`` raises once they are set), NCCL against gloo included (a
  stand-in torchrun whose NCCL products round as TF32 does); the large run keeps the
  run's setting. The torchrun is this interpreter's, never another on the PATH.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import tomllib
import torch

import yaml
from tests.gpu import check as gpu_check
from tests.helpers import ROOT

#: The large run's preset shrunk for the CPU (its generator settings kept).
SMALL_PRESET_NODES = 3000
#: What the report says of each fact of its environment.
FACT_FIELDS = {"status", "value", "error"}


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
    for name, fact in report["environment"].items():
        assert fact.keys() == documented["environment"][name].keys() == FACT_FIELDS, name
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
    assert result.stdout.startswith(f"{sys.executable} -m tests.gpu.check")
    assert report["status"] == "skipped" and report["gpu_expected"] is False
    assert report["environment"]["torch"]["value"] == torch.__version__
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


# ------------------------------------------------- a report whatever fails


#: A DGL whose import fails as it does where scipy is missing.
_BROKEN_DGL = 'raise ModuleNotFoundError("No module named \'scipy\'", name="scipy")\n'


def _broken_dgl_path(tmp_path) -> str:
    """A ``PYTHONPATH`` whose ``dgl`` shadows the installed one and fails to import."""
    (tmp_path / "shadow" / "dgl").mkdir(parents=True)
    (tmp_path / "shadow" / "dgl" / "__init__.py").write_text(_BROKEN_DGL)
    return str(tmp_path / "shadow")


def test_a_report_is_written_when_dgl_does_not_import(tmp_path):
    report_path = tmp_path / "report.json"
    argv = [sys.executable, "-m", "tests.gpu.check", "--no-gpu-expected"]
    result = subprocess.run(
        [*argv, "--out", str(report_path)],
        cwd=tmp_path,
        env={
            **os.environ,
            "CUDA_VISIBLE_DEVICES": "",
            "PYTHONPATH": os.pathsep.join((_broken_dgl_path(tmp_path), str(ROOT))),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == gpu_check.FAILED, result.stdout + result.stderr
    report = json.loads(report_path.read_text())
    facts = report["environment"]
    said = "ModuleNotFoundError: No module named 'scipy'"
    assert facts["dgl"] == {"status": "failed", "value": None, "error": said}
    assert {name for name, fact in facts.items() if fact["status"] != "found"} == {"dgl"}
    assert facts["torch"]["value"] == torch.__version__
    assert report["status"] == "failed" and f"environment dgl ({said})" in report["reason"]
    assert report["reason"] in result.stdout
    assert {e["status"] for e in report["checks"].values()} == {"skipped"}
    _same_fields(report, _documented_report())


def _documented_import_check() -> list[str]:
    """The command docs/gpu-check.md gives to check the imports, run by this interpreter."""
    text = (ROOT / "docs" / "gpu-check.md").read_text()
    (command,) = re.findall(r'^\.venv/bin/python -c "(.*tests\.gpu\.check.*)"$', text, re.M)
    return [sys.executable, "-c", command]


def test_the_documented_import_check_imports_dgl(tmp_path):
    """It names what is missing where DGL's import fails, and passes where it works."""
    env = {**os.environ, "PYTHONPATH": _broken_dgl_path(tmp_path)}
    check = _documented_import_check()  # run from the repository's root, as documented
    run = {"cwd": ROOT, "capture_output": True, "text": True, "timeout": 120}
    broken = subprocess.run(check, env=env, **run)
    assert broken.returncode != 0 and "No module named 'scipy'" in broken.stderr
    fine = subprocess.run(check, **run)
    assert fine.returncode == 0, fine.stderr
    assert "dgl 2.1.0" in fine.stdout


# ------------------------------------------------------------------- TF32


@pytest.fixture
def precision():
    """cuBLAS's and cuDNN's float32 precision as a CUDA run leaves them (``use_tf32``:
    TF32), restored after."""
    settings = (torch.backends.cuda.matmul, torch.backends.cudnn)
    saved = [setting.fp32_precision for setting in settings]
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    yield settings
    for setting, value in zip(settings, saved):
        setting.fp32_precision = value


def test_the_comparisons_switch_tf32_off_with_the_fp32_precision_settings(precision):
    matmul, cudnn = precision
    before = cudnn.fp32_precision
    with gpu_check._float32_precision("ieee"):
        assert (matmul.fp32_precision, cudnn.fp32_precision) == ("ieee", "ieee")
    assert (matmul.fp32_precision, cudnn.fp32_precision) == ("tf32", before)


def test_the_large_run_times_with_the_runs_tf32(precision, monkeypatch):
    """``parallel.tf32: auto`` as a CUDA run takes it (``use_tf32`` stands in for CUDA's
    on the CPU): TF32 during the steps, and the precision as it was after."""
    matmul, _ = precision
    matmul.fp32_precision = "ieee"
    asked, during = [], []

    def use_tf32(setting, device):
        asked.append(setting)
        matmul.fp32_precision = "tf32"
        return True

    train_step = gpu_check.Trainer.train_step

    def noted_step(trainer, *args, **kwargs):
        during.append(matmul.fp32_precision)
        return train_step(trainer, *args, **kwargs)

    monkeypatch.setattr(gpu_check, "use_tf32", use_tf32)
    monkeypatch.setattr(gpu_check.Trainer, "train_step", noted_step)
    preset = yaml.safe_load((ROOT / gpu_check.LARGE_CONFIG).read_text())
    preset["data"]["synthetic"]["num_nodes"] = 600
    preset["sampling"]["batch_size"] = 200
    outcome = gpu_check.large_run(torch.device("cpu"), preset, steps=2)
    assert outcome.problems == [] and outcome.figures["tf32"] is True
    assert asked == [preset.get("parallel", {}).get("tf32", "auto")]
    assert during == ["tf32", "tf32"]
    assert matmul.fp32_precision == "ieee"


# A stand-in torchrun: the run's losses as a correct machine gives them, NCCL's products
# in TF32 (about 1e-3 relative) where parallel.tf32 is on for CUDA.
_STAND_IN_TORCHRUN = """#!{python}
import json, sys
from dgl_scalegnn.config import load_config, switch_on
args = sys.argv[1:]
sets = [args[i + 1] for i, arg in enumerate(args) if arg == "--set"]
cfg = load_config(args[args.index("--config") + 1], sets)
backend = cfg.parallel.backend
rounded = backend == "nccl" and switch_on(cfg.parallel.tf32, "cuda")
with open(args[args.index("--metrics") + 1], "w") as metrics:
    print(json.dumps({{"event": "config", "backend": backend}}), file=metrics)
    for step, loss in enumerate([1.9, 1.7, 1.6]):
        loss *= 1 + 1e-3 * rounded
        print(json.dumps({{"event": "step", "step": step, "loss": loss}}), file=metrics)
"""


def test_nccl_is_compared_with_gloo_with_exact_products(tmp_path, monkeypatch):
    torchrun = tmp_path / "torchrun"
    torchrun.write_text(_STAND_IN_TORCHRUN.format(python=sys.executable))
    torchrun.chmod(0o755)
    monkeypatch.setattr(gpu_check, "_torchrun", lambda directory: torchrun)
    outcome = gpu_check.torchrun_grid(2)
    assert outcome.figures["grid"] == "1x2x1x1"
    assert outcome.figures["backends"] == ["nccl", "gloo"]
    assert outcome.problems == [], outcome.problems
    assert outcome.figures["max_relative_difference"] == 0.0


def test_the_torchrun_is_this_interpreters_never_one_on_the_path(tmp_path, monkeypatch):
    """An interpreter without torchrun beside it (``pip install --user``, a system
    Python), and another one's torchrun on the PATH: the launch runs this one's."""
    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python3"  # this interpreter, no torchrun beside it
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    decoy = tmp_path / "elsewhere"
    decoy.mkdir()
    (decoy / "torchrun").write_text(f"#!/bin/sh\ntouch {tmp_path}/decoy-ran\n")
    (decoy / "torchrun").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("PATH", f"{decoy}{os.pathsep}{os.environ['PATH']}")
    torchrun = gpu_check._torchrun(tmp_path)
    said = subprocess.run([str(torchrun), "--help"], capture_output=True, text=True, timeout=120)
    assert said.returncode == 0, said.stderr
    assert "--nproc-per-node" in said.stdout and "torchrun" in said.stdout
    assert not (tmp_path / "decoy-ran").exists()


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_offline_wheel_set_is_the_projects_at_its_pins():
    """docs/gpu-check.md's download: every dependency of the project but torch at the
    version it pins, and one wheel file fetched for each pin."""
    text = (ROOT / "docs" / "gpu-check.md").read_text()
    command = re.search(r"python3 -m pip download (.*?)\n```", text, re.S).group(1)
    pins = dict(pin.split("==") for pin in re.findall(r"\S+==\S+", command))
    pins = {_canonical(name): version for name, version in pins.items()}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    required = dict(dep.split("==") for dep in project if not dep.startswith("torch=="))
    for name, version in required.items():
        assert pins.get(_canonical(name)) == version, name
    listing = re.search(r"The files it fetched:\n\n```\n(.*?)```", text, re.S).group(1)
    fetched = {}
    for file in listing.split():
        name, version = file.split("-")[:2]
        fetched[_canonical(name)] = version
    assert fetched == pins
