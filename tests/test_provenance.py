"""Provenance: the commit, package versions and device recorded in every result file."""

import importlib.metadata
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

import fp4repro
from fp4repro.provenance import describe_device, device_uuid, provenance
from fp4repro.results import table_provenance, write_json, write_table

REPO = Path(__file__).resolve().parents[1]


def test_records_the_checkout_commit_packages_and_device():
    record = provenance("cpu")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if Path(fp4repro.__file__).resolve().is_relative_to(REPO):  # an editable install of this checkout
        assert record["git_commit"] == head and isinstance(record["git_dirty"], bool)
    assert record["packages"] == {
        name: importlib.metadata.version(name) for name in ("torch", "triton", "megatron-core", "lm-eval")
    }
    assert record["fp4repro"] == fp4repro.__version__
    assert (
        record["device"] == f"cpu ({__import__('platform').machine()}, {torch.get_num_threads()} "
        f"thread{'s' if torch.get_num_threads() != 1 else ''})"
    )
    assert describe_device("cuda") == (torch.cuda.get_device_name() if torch.cuda.is_available() else record["device"])


def test_tables_and_json_carry_it(tmp_path):
    record = provenance("cpu")
    write_table(tmp_path / "t.parquet", pd.DataFrame({"step": [1, 2]}), record)
    assert table_provenance(tmp_path / "t.parquet") == record
    assert pd.read_parquet(tmp_path / "t.parquet")["step"].tolist() == [1, 2]
    pd.DataFrame({"step": [1]}).to_parquet(tmp_path / "plain.parquet")
    assert table_provenance(tmp_path / "plain.parquet") is None
    write_json(tmp_path / "r.json", {"loss": 1.5}, record)
    assert __import__("json").loads((tmp_path / "r.json").read_text()) == {"loss": 1.5, "provenance": record}


def test_a_copied_tree_names_its_commit_in_the_environment(monkeypatch):
    import fp4repro.provenance as prov

    monkeypatch.setenv("FP4REPRO_SOURCE_COMMIT", "0123abc")
    prov._git.cache_clear()
    try:
        record = provenance("cpu")
        assert record["git_commit"] == "0123abc" and record["git_dirty"] is None
    finally:
        monkeypatch.delenv("FP4REPRO_SOURCE_COMMIT")
        prov._git.cache_clear()


def test_a_cpu_result_names_no_gpu():
    assert "device_uuid" not in provenance("cpu") and device_uuid("cpu") is None and device_uuid() is None


@pytest.mark.gpu
def test_a_cuda_result_names_its_physical_gpu():
    record = provenance("cuda")
    assert record["device_uuid"] == str(torch.cuda.get_device_properties(0).uuid)
    assert record["device_uuid"] == provenance("cuda:0")["device_uuid"] != ""
    # float32 products as float32 unless the environment asked for TF32 (then the record says so);
    # switched through the API the record reads (torch >= 2.9: fp32_precision)
    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    was = getattr(matmul, name)
    tf32 = record["fp32_matmul"] == "tf32"
    setattr(matmul, name, ("ieee" if tf32 else "tf32") if name == "fp32_precision" else not tf32)
    try:
        assert provenance("cuda")["fp32_matmul"] == ("ieee" if tf32 else "tf32")
    finally:
        setattr(matmul, name, was)


@pytest.mark.gpu
def test_nvidias_cublas_override_makes_float32_products_tf32_whatever_the_flags(monkeypatch):
    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    was = getattr(matmul, name)
    setattr(matmul, name, "ieee" if name == "fp32_precision" else False)
    try:
        monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "0")
        assert provenance("cuda")["fp32_matmul"] == "ieee"
        monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
        assert provenance("cuda")["fp32_matmul"] == "tf32"
    finally:
        setattr(matmul, name, was)
