from pathlib import Path

import pytest

from fp4repro.config.files import PACKAGED, read_yaml, recorded_name
from fp4repro.errors import ConfigError


def test_records_name_config_files_without_this_machines_paths(tmp_path):
    # the tests run in tmp_path (conftest): a study folder with its own configs/
    local = tmp_path / "configs" / "recipes" / "mine.yaml"
    local.parent.mkdir(parents=True)
    local.write_text("base: ue5m3\n")
    assert recorded_name(PACKAGED / "recipes" / "ue5m3.yaml") == "fp4repro/configs/recipes/ue5m3.yaml"
    assert recorded_name(local) == "configs/recipes/mine.yaml"
    assert recorded_name("configs/recipes/mine.yaml") == "configs/recipes/mine.yaml"
    # reached through a link or "..": named by where it is
    (tmp_path / "linked.yaml").symlink_to(PACKAGED / "recipes" / "nvfp4.yaml")
    assert recorded_name(tmp_path / "linked.yaml") == "fp4repro/configs/recipes/nvfp4.yaml"
    outside = tmp_path.parent / f"{tmp_path.name}-other.yaml"
    assert recorded_name(tmp_path / ".." / outside.name) == str(outside.resolve())
    assert Path(recorded_name(outside)).is_absolute()


def test_numbers_in_exponent_notation_are_numbers(tmp_path):
    # issue 42: YAML 1.1 reads 2e3 as a string, and the schema's error did not say why
    path = tmp_path / "numbers.yaml"
    path.write_text(
        "a: 2e3\nb: 2.0e3\nc: 1e-3\nd: 1.4e11\ne: 3.0e-3\nf: '2e3'\ng: ue5m3\nh: 2048\ni: 1.4e+11\nj: 1.5\n"
    )
    assert read_yaml(path) == {
        "a": 2000,
        "b": 2000,
        "c": 0.001,
        "d": 140_000_000_000,
        "e": 0.003,
        "f": "2e3",
        "g": "ue5m3",
        "h": 2048,
        "i": 140_000_000_000,
        "j": 1.5,
    }
    # a whole number counts (steps, tokens), with a signed exponent too (YAML 1.1 reads that one as a float)
    assert all(isinstance(read_yaml(path)[k], int) for k in "abdhi")


def test_a_recipe_with_target_2e3_loads_with_t_2000(tmp_path, capsys):
    from fp4repro.cli import main
    from fp4repro.config.recipe import load_recipe

    path = tmp_path / "t2e3.yaml"
    path.write_text("name: t2e3\ndefaults: {element: e2m1, scale: ue5m3, block: [1, 16], target: 2e3, rounding: rne}\n")
    assert load_recipe(path).defaults["target"] == 2000
    assert main(["recipe", str(path), "--model", "tiny"]) == 0
    assert "e2m1/ue5m3 1x16 T=2000" in capsys.readouterr().out


def test_a_binary_file_is_a_one_line_config_error_naming_it(tmp_path):
    # issue 42: a binary file given as a recipe was a 24-line UnicodeDecodeError
    import subprocess
    import sys

    path = tmp_path / "binary.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match=r"binary\.yaml: not a text file: byte 0x80 at offset 128 is not UTF-8"):
        read_yaml(path)
    proc = subprocess.run(
        [sys.executable, "-m", "fp4repro.cli", "recipe", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"fp4repro recipe: error: {path}: not a text file")


def test_every_packaged_config_reads_the_same_with_libyamls_parser_and_pythons(tmp_path):
    # read_yaml parses with libyaml where PyYAML has it (a report reads every recipe file); the
    # pure-Python parser with the same resolvers and constructors must give the same values
    import yaml

    from fp4repro.config.files import _ConfigLoader

    class PurePython(yaml.SafeLoader):
        yaml_constructors = _ConfigLoader.yaml_constructors
        yaml_implicit_resolvers = _ConfigLoader.yaml_implicit_resolvers

    if yaml.__with_libyaml__:
        assert issubclass(_ConfigLoader, yaml.CSafeLoader)
    paths = sorted(PACKAGED.rglob("*.yaml"))
    assert len(paths) > 30
    for path in paths:
        assert read_yaml(path) == yaml.load(path.read_text(encoding="utf-8"), Loader=PurePython), path
    # the exponent numbers too, which only the resolvers added here read as numbers
    numbers = tmp_path / "numbers.yaml"
    numbers.write_text("a: 2e3\nb: 1.4e+11\nc: [1e-3, '2e3']\n")
    expected = {"a": 2000, "b": 140_000_000_000, "c": [0.001, "2e3"]}
    assert read_yaml(numbers) == expected and yaml.load(numbers.read_text(), Loader=PurePython) == expected
