"""GPU peaks and the throughput projection's uncertain parameters: ``configs/devices.yaml``
(``--devices`` names another file), checked against ``schemas/devices.schema.json``.

A value is a number or a range [low, high] (``Value``); the projection evaluates every
combination of the ranges' ends and reports the band they span. A device's key is the tag of the
name the driver gives it (``device_tag``: "NVIDIA H200" -> h200), so that a measurement finds the
peaks of the GPU it ran on (``Devices.of_name``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fp4repro.config.files import PACKAGED, find_config, read_yaml, recorded_name, schema_error, schema_field
from fp4repro.errors import ConfigError


def device_tag(name: str | None) -> str:
    """The tag of a device name, as files and ``devices.yaml`` name it: "NVIDIA H200" -> "h200";
    no device -> "cpu"."""
    if not name:
        return "cpu"
    return "_".join(name.lower().replace("nvidia", "").split())


@dataclass(frozen=True)
class Value:
    """A parameter: ``low == high`` when it is known."""

    low: float
    high: float

    @classmethod
    def of(cls, raw) -> Value:
        return cls(float(raw), float(raw)) if isinstance(raw, (int, float)) else cls(float(raw[0]), float(raw[1]))

    @property
    def mid(self) -> float:
        return (self.low + self.high) / 2

    @property
    def uncertain(self) -> bool:
        return self.low != self.high


@dataclass(frozen=True)
class Device:
    key: str
    name: str
    peak_tflops: dict[str, Value]  # bf16, fp8, fp4: dense tensor-core peaks
    hbm_tb_per_s: Value
    sources: tuple[str, ...]


@dataclass(frozen=True)
class Devices:
    devices: dict[str, Device]
    parameters: dict[str, Value]  # efficiency_transfer, fp4_efficiency_vs_fp8, other_bandwidth_bound, rht_hidden
    why: dict[str, str]
    path: str

    def of_name(self, name: str | None) -> Device | None:
        """The device the driver calls ``name`` (``torch.cuda.get_device_name()``), None when this
        file has no entry under its tag (``device_tag``; a CPU has none)."""
        return self.devices.get(device_tag(name))

    @property
    def shown_path(self) -> str:
        """The file as a record names it (``recorded_name``), "(packaged)" after a packaged one."""
        name = recorded_name(self.path)
        return f"{name} (packaged)" if Path(self.path).resolve().is_relative_to(PACKAGED) else name


def load_devices(name_or_path: str | Path = "devices") -> Devices:
    """The devices file (``configs/devices.yaml`` of the working directory, else the packaged
    one, or a path), validated; errors name the file and the field."""
    path = find_config("", name_or_path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such devices file")
    raw = read_yaml(path)
    error = schema_error(raw, "devices.schema.json")
    if error is not None:
        raise ConfigError(f"{path}: field '{schema_field(error)}': value {error.instance!r}: {error.message}")
    bad = [
        f"{key}.{part}"
        for key, d in raw["devices"].items()
        for part, v in [*d["peak_tflops"].items(), ("hbm_tb_per_s", d["hbm_tb_per_s"])]
        if isinstance(v, list) and not 0 < v[0] <= v[1]
    ]
    bad += [
        f"projection.{key}"
        for key, p in raw["projection"].items()
        if isinstance(p["value"], list) and not p["value"][0] <= p["value"][1]
    ]
    if bad:
        raise ConfigError(f"{path}: field '{bad[0]}': a range must be [low, high] with 0 < low <= high")
    devices = {
        key: Device(
            key,
            d["name"],
            {p: Value.of(v) for p, v in d["peak_tflops"].items()},
            Value.of(d["hbm_tb_per_s"]),
            tuple(d["sources"]),
        )
        for key, d in raw["devices"].items()
    }
    return Devices(
        devices,
        {k: Value.of(p["value"]) for k, p in raw["projection"].items()},
        {k: p["why"] for k, p in raw["projection"].items()},
        str(path),
    )
