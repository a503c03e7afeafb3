import json
import subprocess
import sys

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
    assert main(["recipe", "nvfp4", "--layers", "8"]) == 0
    out = capsys.readouterr().out
    assert "layers 4-7 of 8" in out and "wgrad.dy  e2m1/e4m3 1x16 T=448 SR current RHT" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndefaults: {block: [3, 3]}\n")
    assert main(["recipe", str(bad)]) == 2
    assert "defaults.block" in capsys.readouterr().err


def test_formats_and_explain(capsys):
    assert main(["formats", "ue5m3"]) == 0
    assert "114688" in capsys.readouterr().out
    assert main(["explain", "--scale", "e4m3", "--amax", "0.05"]) == 0
    assert "saturated blocks 1" in capsys.readouterr().out


def test_bench_quant_writes_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "quant", "--size", "64", "--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 5 and all(r["median_s"] > 0 for r in rows)


def test_model_command_counts_8b_and_lists_specs(capsys):
    assert main(["model", "nemotron_h_8b"]) == 0
    assert "8,100,852,736" in capsys.readouterr().out
    assert main(["model", "tiny", "--recipe", "ue5m3"]) == 0
    out = capsys.readouterr().out
    assert "layers.3.mixer.o_proj" in out and "wgrad.dy=e2m1/ue5m3 1x16 T=448 SR periodic(50)" in out
    assert "lm_head                  all operands bf16" in out


def test_experiment_command(capsys):
    assert main(["experiment"]) == 0 and "tiny" in capsys.readouterr().out
    assert main(["experiment", "tiny", "--recipes"]) == 0
    assert capsys.readouterr().out.split() == ["bf16", "nvfp4", "ue5m3", "ue5m3_t2048", "mxfp4"]
    assert main(["experiment", "tiny"]) == 0
    assert "stage2: 131,072 tokens (64 steps), blend code 0.6, prose 0.4" in capsys.readouterr().out
