"""The GPU this process sees, as the workflow names its throughput file, and whether another
process keeps it busy (through nvidia-smi, which is replaced here by a script that answers as the
driver would)."""

import pytest
from fake_smi import fake_smi, loaded_smi

from fp4repro.bench.device import BUSY_PERCENT, device_tag, refuse_a_busy_gpu, throughput_here, visible_gpu
from fp4repro.errors import FP4ReproError


def test_the_visible_gpu_names_the_file_the_workflow_measures(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, ["NVIDIA B200", "NVIDIA H200"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert throughput_here("results/bench", "small") == "results/bench/throughput_b200_small.json"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # the first GPU the process may use
    assert visible_gpu() == "NVIDIA H200"
    assert (tmp_path / "calls").read_text().splitlines()[-1].startswith("-i 1 ")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # none
    assert throughput_here("results/bench", "small") is None


def test_no_driver_means_no_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpu() is None and throughput_here("results/bench", "tiny") is None


def test_device_names_become_file_tags():
    assert device_tag("NVIDIA H200") == "h200"
    assert device_tag("NVIDIA GeForce RTX 4090") == "geforce_rtx_4090"
    assert device_tag(None) == "cpu"


@pytest.fixture
def three_quick_readings(monkeypatch):
    monkeypatch.setattr("fp4repro.bench.device.READINGS", 3)
    monkeypatch.setattr("fp4repro.bench.device.READING_INTERVAL_S", 0.01)


def test_a_gpu_busy_in_every_reading_is_refused_with_what_was_read(tmp_path, monkeypatch, three_quick_readings):
    loaded_smi(tmp_path, monkeypatch, [f"{BUSY_PERCENT}, 20755"])
    with pytest.raises(FP4ReproError) as err:
        refuse_a_busy_gpu("bench throughput")
    message = str(err.value)
    assert message.startswith("bench throughput: another process is using the GPU (NVIDIA H100 80GB HBM3")
    assert f"utilization {BUSY_PERCENT}%, 20755 MiB in use, in each of 3 readings" in message
    assert (tmp_path / "n").read_text().strip() == "3"


@pytest.mark.parametrize(
    "loads, read",
    [
        (["98, 20755", "98, 20755", f"{BUSY_PERCENT - 1}, 20755"], 3),  # the last below: a process just ended
        (["0, 3"], 1),  # idle: one reading is enough
        (["[N/A], 20755"], 1),  # no utilization reported (MIG): nothing to check
    ],
)
def test_a_gpu_not_busy_in_every_reading_is_measured_on(tmp_path, monkeypatch, three_quick_readings, loads, read):
    loaded_smi(tmp_path, monkeypatch, loads)
    refuse_a_busy_gpu("bench kernels")
    assert (tmp_path / "n").read_text().strip() == str(read)


def test_without_a_driver_nothing_is_checked(tmp_path, monkeypatch, three_quick_readings):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    refuse_a_busy_gpu("bench kernels")


@pytest.mark.gpu
def test_the_drivers_own_answer_is_one_the_check_reads():
    # a reading the check understands, not one it skips (whatever else runs on the GPU meanwhile)
    from fp4repro.bench.device import _query_visible

    percent, memory = _query_visible("utilization.gpu,memory.used")
    assert percent.isdigit() and memory.isdigit()
