import json
import subprocess
import sys
from pathlib import Path

import pytest

import fp4repro.cli.configs as configs
from fp4repro.cli import main


def test_help_lists_subcommands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for cmd in ("formats", "recipe", "explain", "bench"):
        assert cmd in out


def test_console_script_help():
    out = subprocess.run([sys.executable, "-m", "fp4repro.cli", "--help"], capture_output=True, text=True, check=True)
    assert "UE5M3" in out.stdout


def test_recipe_show_and_error(capsys, tmp_path):
    # on the 8B (the default model): the linears most share, then the BF16 final eight blocks
    assert main(["recipe", "nvfp4"]) == 0
    out = capsys.readouterr().out
    assert "104 internal linears: 88 quantized, 16 BF16" in out and "BF16 layers: 8 of 52 (44-51)" in out
    assert "88 of 104 linears:" in out and "wgrad.dy  e2m1/e4m3 1x16 T=448 SR current RHT" in out
    assert "layers 44-51 (fc1, fc2, in_proj, out_proj):\n  every operand bf16" in out
    for model, bf16 in (("small", "BF16 layers: 2 of 16 (14-15)"), ("tiny", "BF16 layers: 1 of 5 (4)")):
        assert main(["recipe", "nvfp4", "--model", model]) == 0
        assert bf16 in capsys.readouterr().out
    # ue5m3: T = 2048 only on wgrad dY of the final 4/24 of the MLP layers' fc2
    assert main(["recipe", "ue5m3"]) == 0
    out = capsys.readouterr().out
    assert "100 of 104 linears:" in out and "BF16 layers:" not in out
    tail = out.split("layers 45, 47, 49, 51 (fc2):\n")[1].split("\n\n")[0]
    assert tail == "  wgrad.dy  e2m1/ue5m3 1x16 T=2048 STOCHASTIC_FAST periodic(50) zero-scale-one"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndefaults: {block: [3, 3]}\n")
    assert main(["recipe", str(bad)]) == 2
    assert "defaults.block" in capsys.readouterr().err


def test_recipe_prints_its_sources_after_the_operand_table(capsys):
    assert main(["recipe", "ue5m3_t2048_all_dy", "--model", "tiny"]) == 0
    out = capsys.readouterr().out
    table, sources = out.split("\nsources:\n")
    assert "10 of 10 linears:" in table and "dgrad.dy  e2m1/ue5m3 1x16 T=2048 STOCHASTIC_FAST periodic(50)" in table
    lines = sources.splitlines()
    starts = [line.split(":")[0].strip() for line in lines if line.startswith("  ") and not line.startswith("   ")]
    assert starts == [
        "element format (quotation, inherited from ue5m3)",
        "scale format (quotation, inherited from ue5m3)",
        "block shapes (quotation, inherited from ue5m3)",
        "target T (quotation)",  # its own: the choice it changes
        "target T (reading)",
        "tensor amax (quotation, inherited from ue5m3)",
        "rounding (quotation, inherited from ue5m3)",
        "RHT (quotation, inherited from ue5m3)",
        "BF16 layers (quotation, inherited from ue5m3)",
        "GEMM model (quotation, inherited from ue5m3)",
        "inference policy (quotation, inherited from ue5m3)",
    ]
    assert "GEMM model (GEMMs of two quantized operands): probe_matched(group 64, lattice 1/1024)" in table
    assert "inference policy (eval policy recipe): replay" in table
    assert "They do not use a randomized" in sources and "not cited" not in sources
    assert all(len(line) <= 100 for line in lines)


def test_formats_and_explain(capsys):
    assert main(["formats", "ue5m3"]) == 0
    assert "61440" in capsys.readouterr().out
    assert main(["explain", "--scale", "e4m3", "--amax", "0.05"]) == 0
    assert "saturated blocks 1" in capsys.readouterr().out


def test_bench_quant_writes_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "quant", "--size", "64", "--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 5 and all(r["median_s"] > 0 for r in rows)


@pytest.mark.parametrize(
    "what, module, measure",
    [("kernels", "kernels", "run"), ("live", "live", "run"), ("gemm", "gemm", "bench_gemm"), ("head", "head", "run")],
)
def test_a_gpu_benchmark_writes_the_file_its_device_has_committed(monkeypatch, capsys, what, module, measure):
    """A rerun on an H200 replaces the committed file that the docs render. No GPU here: the device's
    name is given and the measurement stands in, so that only the command's choice of file runs."""
    import importlib

    import torch

    import fp4repro.cli.bench as cli_bench

    bench = importlib.import_module(f"fp4repro.bench.{module}")
    written = []
    monkeypatch.setattr(cli_bench, "_cuda_present", lambda *why: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *device: "NVIDIA H200")
    monkeypatch.setattr(bench, measure, lambda *args, out=None, **kwargs: written.append(out or args[-1]) or {})
    monkeypatch.setattr(bench, "table", lambda *args: "", raising=False)
    if what == "head":
        monkeypatch.setattr(bench, "training_shapes", lambda: [])
    assert main(["bench", what]) == 0
    repo = Path(__file__).resolve().parents[2]
    (out,) = written
    assert (repo / out).is_file() and Path(out).parent == Path("results/bench"), out
    assert f"wrote {out}" in capsys.readouterr().out


def _an_h100_under_load(tmp_path, monkeypatch, loads):
    """This process sees an H100 whose nvidia-smi load readings are ``loads`` (fake_smi.loaded_smi),
    read 0.01 s apart."""
    import torch
    from fake_smi import loaded_smi

    import fp4repro.cli.bench as cli_bench

    loaded_smi(tmp_path, monkeypatch, loads)
    monkeypatch.setattr(cli_bench, "_cuda_present", lambda *why: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr("fp4repro.bench.device.READING_INTERVAL_S", 0.01)


@pytest.mark.parametrize("what", ["kernels", "live", "gemm", "head", "throughput", "components"])
def test_a_gpu_benchmark_does_not_start_on_a_gpu_another_process_keeps_busy(tmp_path, monkeypatch, capsys, what):
    _an_h100_under_load(tmp_path, monkeypatch, ["97, 20755"])
    assert main(["bench", what, "--out", str(tmp_path / "out.json")]) != 0
    err = capsys.readouterr().err
    assert f"bench {what}" in err and "another process is using the GPU" in err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("what", ["throughput", "components"])
def test_a_shape_benchmark_checks_the_gpu_again_before_each_shape(tmp_path, monkeypatch, capsys, what):
    # paper8b times two body shapes; another process starts on the GPU while the first is measured
    from fp4repro.bench import components, throughput

    _an_h100_under_load(tmp_path, monkeypatch, ["3, 20755", "97, 20755"])
    measured = []
    module = throughput if what == "throughput" else components
    monkeypatch.setattr(module, "run", lambda model, recipes, *shape, **kw: measured.append(shape or kw) or {})
    monkeypatch.setattr(module, "record", lambda *args: None)
    monkeypatch.setattr(module, "table", lambda *args: "")
    assert main(["bench", what, "--experiment", "paper8b", "--out", str(tmp_path / "out.json")]) != 0
    err = capsys.readouterr().err
    assert len(measured) == 1, measured
    second = "1x8192" if what == "throughput" else "8,192 tokens"
    assert f"bench {what} (" in err and second in err and "another process is using the GPU" in err


def test_model_command_counts_8b_and_lists_specs(capsys):
    assert main(["model", "nemotron_h_8b"]) == 0
    assert "8,100,852,736" in capsys.readouterr().out
    assert main(["model", "tiny", "--recipe", "ue5m3"]) == 0
    out = capsys.readouterr().out
    assert "layers.3.mixer.o_proj" in out and "wgrad.dy=e2m1/ue5m3 1x16 T=448 STOCHASTIC_FAST periodic(50)" in out
    assert "layers.4.mixer.fc2" in out and "wgrad.dy=e2m1/ue5m3 1x16 T=2048 STOCHASTIC_FAST" in out
    assert "lm_head                  not quantized: BF16 copies of input and weight multiplied in FP32" in out


def test_the_papers_8b_under_ue5m3_and_nvfp4(capsys):
    """`fp4repro model nemotron_h_8b_paper --recipe ...` and `fp4repro recipe ... --model
    nemotron_h_8b_paper`: 112 FP4 linears under ue5m3, T = 2048 only on wgrad dY of the fc2 of
    layers 45, 47, 49, 51, the head in FP32; under nvfp4 the final eight blocks' 16 projections BF16."""
    assert main(["model", "nemotron_h_8b_paper", "--recipe", "ue5m3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "parameters: 8,084,075,520 (7,010,333,696 without embedding and LM head)" in lines
    linears = [line.split()[0] for line in lines if line.startswith("  layers.")]
    assert len(linears) == 112 and "layers.7.mixer.v_proj" in linears
    t2048 = [line.split()[0] for line in lines if "T=2048" in line]
    assert t2048 == [f"layers.{i}.mixer.fc2" for i in (45, 47, 49, 51)]
    assert all(
        line.count("T=2048") == 1 and "wgrad.dy=e2m1/ue5m3 1x16 T=2048" in line for line in lines if "=2048" in line
    )
    assert lines[-1].split()[:2] == ["lm_head", "not"] and "multiplied in FP32 (every recipe)" in lines[-1]
    assert main(["model", "nemotron_h_8b_paper", "--recipe", "nvfp4"]) == 0
    bf16 = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "all operands bf16" in line]
    assert len(bf16) == 16 and {name.split(".")[1] for name in bf16} == {str(i) for i in range(44, 52)}
    assert main(["recipe", "ue5m3", "--model", "nemotron_h_8b_paper"]) == 0
    out = capsys.readouterr().out
    assert "112 internal linears: 112 quantized, 0 BF16" in out and "108 of 112 linears:" in out
    tail = out.split("layers 45, 47, 49, 51 (fc2):\n")[1].split("\n\n")[0]
    assert tail == "  wgrad.dy  e2m1/ue5m3 1x16 T=2048 STOCHASTIC_FAST periodic(50) zero-scale-one"
    assert main(["recipe", "nvfp4", "--model", "nemotron_h_8b_paper"]) == 0
    out = capsys.readouterr().out
    assert "112 internal linears: 96 quantized, 16 BF16" in out and "BF16 layers: 8 of 52 (44-51)" in out


def test_experiment_command(capsys, monkeypatch):
    assert main(["experiment"]) == 0 and "tiny" in capsys.readouterr().out
    assert main(["experiment", "tiny", "--recipes"]) == 0
    assert capsys.readouterr().out.split() == ["bf16", "nvfp4", "ue5m3", "ue5m3_t448", "mxfp4"]
    assert main(["experiment", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "stage2: 51,200 tokens (50 steps), blend code 0.6, prose 0.4" in out
    assert (
        "\nschedule: lr 0.003 (WSD over 150 steps): a linear warmup over 8 steps, the peak to step 112, then a "
        "linear decay over the last 38 steps (25.3%) to 10% of the peak\n"
    ) in out
    assert "\n  nvfp4: 1 of 5 layers BF16 (20%): layer 4\n" in out and "\n  ue5m3: 0 of 5 layers BF16 (0%)\n" in out
    assert "\n  bf16: 5 of 5 layers BF16 (100%)\n" in out
    assert "\nruns: 5, seeds bf16 0; nvfp4 0; ue5m3 0; ue5m3_t448 0; mxfp4 0\n" in out
    assert "12 checkpoints\n" in out  # tiny trains in fast mode: nothing said
    assert main(["experiment", "small_megatron"]) == 0
    assert "lr 0.001 (WSD), 12 checkpoints, deterministic GPU algorithms\n" in capsys.readouterr().out
    # the committed first small study, read where the workflow reads it: at the repository's root,
    # whose results/small_v1/recipes/ holds the recipes its runs were made with
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert main(["experiment", "small_v1"]) == 0
    assert (
        "runs: 10, seeds bf16 0; nvfp4 0, 1, 2; ue5m3 0, 1, 2; ue5m3_t2048 0; ue5m3_auto 0; ue5m3_t8192 0 (imported"
    ) in capsys.readouterr().out
    # the study of the paper's own recipes: its plan and GPU budget
    assert main(["experiment", "small"]) == 0
    out = capsys.readouterr().out
    assert "runs: 27, seeds nvfp4 0, 1, 2, 3, 4, 5, 6, 7; ue5m3 0, 1, 2, 3, 4, 5, 6, 7; ue5m3_te_settings 0, 1, 2;" in (
        out
    )
    assert "\nGPU budget: 5 minutes per run (median), 150 for the study\n" in out


@pytest.mark.parametrize(
    "experiment, expected",
    [
        (
            "paper8b",
            [
                "nvfp4: 8 of 52 layers BF16 (15.4%): layers 44-51",
                "nvfp4_first_last_bf16: 2 of 52 layers BF16 (3.8%): layers 0, 51",
                "nvfp4_no_bf16_tail: 0 of 52 layers BF16 (0%)",
                "ue5m3_w1x16: 0 of 52 layers BF16 (0%)",
            ],
        ),
        (
            "tiny",
            [
                "nvfp4: 1 of 5 layers BF16 (20%): layer 4",
                "nvfp4_first_last_bf16: 2 of 5 layers BF16 (40%): layers 0, 4",
                "nvfp4_no_bf16_tail: 0 of 5 layers BF16 (0%)",
                "ue5m3_w1x16: 0 of 5 layers BF16 (0%)",
            ],
        ),
    ],
)
def test_experiment_shows_the_bf16_share_of_each_recipe(capsys, experiment, expected):
    assert (
        main(
            [
                "experiment",
                experiment,
                "--add-recipe",
                "nvfp4_first_last_bf16",
                "--add-recipe",
                "nvfp4_no_bf16_tail",
                "--add-recipe",
                "ue5m3_w1x16",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    for line in expected:
        assert f"  {line}" in lines


def test_experiment_counts_a_layer_bf16_when_all_its_linears_are(capsys, tmp_path):
    # on tiny (M-M*-) the MLP layers 1 and 4 have only fc1 and fc2, the attention layer 3 only qkv/o_proj
    (tmp_path / "mlp_bf16.yaml").write_text(
        "name: mlp_bf16\nbase: ue5m3\ndescription: ue5m3 with its MLPs in BF16.\n"
        "overrides:\n  - {layers: '0:', linears: [fc1, fc2], defaults: bf16}\n"
        "sources:\n  - {choice: BF16 layers, kind: reading, source: 'every MLP linear in BF16: this test'}\n"
        # its overrides replace its base's, a T of some layers among them (where the base has one)
        "  - {choice: target T, kind: reading, source: 'T = 448 in every quantized linear'}\n"
    )
    assert main(["experiment", "tiny", "--add-recipe", str(tmp_path / "mlp_bf16.yaml")]) == 0
    assert "  mlp_bf16: 2 of 5 layers BF16 (40%): layers 1, 4" in capsys.readouterr().out.splitlines()


def _fp4repro(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fp4repro.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_a_config_error_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndefaults: {block: [3, 3]}\n")
    proc = _fp4repro("recipe", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"fp4repro recipe: error: {bad}: field")


def test_an_input_error_is_one_line_and_exit_1(tmp_path):
    proc = _fp4repro("plot", "nll", str(tmp_path / "results/x/eval/a/nll.parquet"), "--out", str(tmp_path / "n.png"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert "nll.parquet: no such file" in proc.stderr


def test_debug_shows_the_traceback_of_a_config_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndefaults: {block: [3, 3]}\n")
    proc = _fp4repro("--debug", "recipe", str(bad))
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "RecipeError" in proc.stderr


def test_any_other_error_keeps_its_traceback(monkeypatch):
    # a ValueError from torch, pandas or a bug is not a message for the user: it propagates
    monkeypatch.setattr(configs, "_cmd_formats", lambda args: int("not a number"))
    with pytest.raises(ValueError, match="invalid literal"):
        main(["formats"])


def test_configs_resolve_in_the_working_directory_first(tmp_path, capsys, monkeypatch):
    (tmp_path / "configs" / "recipes").mkdir(parents=True)
    (tmp_path / "configs" / "recipes" / "ue5m3.yaml").write_text("name: ue5m3\ndescription: mine\ndefaults: bf16\n")
    monkeypatch.chdir(tmp_path)
    assert main(["recipe", "ue5m3", "--model", "tiny"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ue5m3: mine") and "fprop.x   bf16" in out
    assert "sources: none given\nnot cited: element format, scale format, block shapes, target T" in out
    assert main(["recipe"]) == 0
    listing = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert listing["ue5m3"] == "configs/recipes/ue5m3.yaml" and listing["nvfp4"] == "packaged"


def test_bad_command_options_are_config_errors(capsys):
    assert main(["formats", "e9m9"]) == 2
    assert "format 'e9m9': 19 bits; at most 8 are supported" in capsys.readouterr().err
    assert main(["explain", "--scale", "e4m3", "--target", "1000"]) == 2
    assert "--target: value 1000.0: must satisfy 0 < T <= 448" in capsys.readouterr().err
    # an option the command does not have: named with that command's usage, whose options it lists
    with pytest.raises(SystemExit) as stopped:
        main(["recipe", "ue5m3", "--layers", "52"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "fp4repro recipe: error: unrecognized arguments: --layers 52" in err
    assert err.startswith("usage: fp4repro recipe [-h] [--model MODEL]")
    # fp4repro's own option after the command, or an unknown one before it: told with fp4repro's usage
    for argv in (["recipe", "ue5m3", "--debug"], ["--bogus", "recipe", "ue5m3"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert capsys.readouterr().err.startswith("usage: fp4repro [-h] [--debug] <command>")


def test_a_full_disk_in_any_writer_is_one_line_naming_the_file_and_debug_keeps_the_traceback(
    monkeypatch, capsys, tmp_path
):
    # a writer other than fp4repro.util's atomic ones (megatron-core's checkpoints, say) fails with ENOSPC
    import errno

    target = tmp_path / "shard.distcp"

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", target and str(target))

    monkeypatch.setattr(configs, "_cmd_formats", full)
    assert main(["formats"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fp4repro formats: error: disk full writing {target}; ")
    assert err.endswith(" bytes free\n") and "Traceback" not in err
    with pytest.raises(OSError, match="No space left on device"):
        main(["--debug", "formats"])
    # a failed write() names no file: no free space of some other filesystem is quoted for it
    target = None
    assert main(["formats"]) == 1
    err = capsys.readouterr().err
    assert err == "fp4repro formats: error: disk full writing a file; run with --debug to see which\n"


def test_text_that_is_not_utf8_in_a_reader_without_its_own_check_is_one_line(monkeypatch, capsys):
    def undecodable(args):
        return b"\xff\xfe".decode()

    monkeypatch.setattr(configs, "_cmd_formats", undecodable)
    assert main(["formats"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fp4repro formats: error: a file is not UTF-8 text (")
    with pytest.raises(UnicodeDecodeError):
        main(["--debug", "formats"])


def test_a_closed_pipe_ends_the_command_quietly():
    # issue 42: `fp4repro model nemotron_h_8b --recipe nvfp4 | head` ended in a BrokenPipeError traceback
    proc = subprocess.Popen(
        [sys.executable, "-m", "fp4repro.cli", "model", "nemotron_h_8b", "--recipe", "nvfp4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # the reader is gone before the first line: every write finds the pipe closed
    assert proc.wait(timeout=300) == 141  # a shell's status of a command that SIGPIPE ended
    assert proc.stderr.read() == ""
    proc.stderr.close()


def test_debug_keeps_the_traceback_of_a_closed_pipe():
    proc = subprocess.Popen(
        [sys.executable, "-m", "fp4repro.cli", "--debug", "model", "tiny", "--recipe", "nvfp4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()
    assert proc.wait(timeout=300) not in (0, 141)  # 1, or 120 where the interpreter's last flush fails too
    err = proc.stderr.read()
    proc.stderr.close()
    assert "Traceback" in err and "BrokenPipeError" in err


def test_a_stop_after_below_one_step_is_a_config_error_before_any_folder_is_made(capsys, tmp_path):
    # issue 42: --stop-after -3 was accepted, made a run folder and trained nothing
    for steps in ("-3", "0"):
        assert main(["train", "--recipe", "bf16", "--stop-after", steps, "--out", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert err == f"fp4repro train: error: --stop-after: value {steps}: a number of optimizer steps, at least 1\n"
    assert list(tmp_path.iterdir()) == []  # no run folder, no results/ (the tests run in tmp_path)
