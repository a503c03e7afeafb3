from pathlib import Path

from fp4repro.config.files import PACKAGED, recorded_name


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
