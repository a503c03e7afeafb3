"""The GPU this process sees, as the workflow names its throughput file."""

import torch

from fp4repro.bench.device import device_tag, throughput_here


def test_the_visible_gpu_names_the_file_the_workflow_measures(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA B200")
    assert throughput_here("results/bench", "small") == "results/bench/throughput_b200_small.json"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert throughput_here("results/bench", "small") is None


def test_device_names_become_file_tags():
    assert device_tag("NVIDIA H200") == "h200"
    assert device_tag("NVIDIA GeForce RTX 4090") == "geforce_rtx_4090"
    assert device_tag(None) == "cpu"
