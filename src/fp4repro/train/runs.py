"""The folders of a recipe's training runs: one per fingerprint, kept side by side.

    results/<experiment>/train/<recipe>/seed<seed>/   ``out``: what the workflow reads
      done.json, metrics.parquet, telemetry.parquet    the finished run (written last)
      .lock                                        held by the training at work (``fp4repro.train.lock``)
      runs/<fingerprint>/                          one run: everything it needs to resume
        run.json                                   whose run it is, what the fingerprint covers; every attempt
        token_files_verified.json                  the data's token files this run checked (size, time, digest)
        resume/resume_<step>.pt                    rolling resume checkpoints (the newest two)
        ckpt/step_<step>.pt                        evaluation checkpoints
        metrics/upto_<step>.parquet                the rows of the steps after the previous part,
        telemetry/upto_<step>.parquet              up to and including <step>

A run's *fingerprint* is a digest of what changes the numbers it computes: the model config,
the recipe's numerics, the prepared data, and the training fields that change the optimization
(``TrainConfig.NUMERIC_FIELDS``). Anything else (telemetry cadence, resume cadence, the final
window) can change and the run resumes. A changed fingerprint starts a new run folder beside the
old ones, which are kept until ``fp4repro runs --prune`` removes them.

A folder ``out`` belongs to one experiment, recipe and seed (``check_owner``): its top-level files
are that run's, so another recipe given the same folder is refused rather than replacing them.

Metrics and telemetry are written as parts, one per resume checkpoint and before it, so a resume
checkpoint holds only the state to continue from (it does not grow with the run). Resuming from
step S drops the parts after S (written by an attempt that died before its next checkpoint).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd

from fp4repro.config.numerics import suite_fingerprint
from fp4repro.data import SAMPLING
from fp4repro.errors import FP4ReproError
from fp4repro.megatron.resume import resume_dirs
from fp4repro.results import write_table
from fp4repro.train.checkpoint import resume_checkpoints
from fp4repro.util import atomic_write_json, json_digest, plain_json

RUNS = "runs"
PART = re.compile(r"^upto_(\d{8})\.parquet$")


def run_numerics(
    model_config,
    recipe,
    data_hash: str,
    train_config,
    seed: int,
    backend: str = "reference",
    init: str | None = None,
    parallel=None,
) -> dict:
    """What a run's numbers depend on, as JSON values (the fingerprint's content). The backend
    enters only when it is not the reference (the two round differently), so reference runs keep
    the fingerprints they had before there was a second backend. The tensor-parallel size enters
    only with ``tp_amax: local`` (each shard scaled by its own amax: the numbers depend on the
    split); with the group's amax a recipe means the same at every tensor size."""
    defaults, operands, overrides, gemm = recipe.numerics()
    model = plain_json(model_config)
    if model.get("qkv") == "fused":  # (fused q/k/v keeps the fingerprints made before the field)
        del model["qkv"]
    numerics = {
        "model": model,
        "recipe": {"defaults": defaults, "operands": operands, "overrides": overrides},
        "data": data_hash,
        "sampling": SAMPLING,
        "train": train_config.numerics(),
        "seed": seed,
        # the suite's numerics definition (formats, rounding rules, kernels): a run made under another
        # computes other numbers from the same recipe (fp4repro.config.numerics)
        "numerics": suite_fingerprint(),
    }
    if gemm.kind != "fp32":  # (fp32 runs keep the fingerprints made before the GEMM had a model)
        numerics["recipe"]["gemm"] = gemm
    if backend != "reference":
        numerics["backend"] = backend
    if init is not None:  # the sha256 of the checkpoint the run starts from
        numerics["init"] = init
    if parallel is not None and parallel.tensor > 1 and parallel.tp_amax == "local":
        numerics["tensor_parallel"] = {"tensor": parallel.tensor, "tp_amax": "local"}
    return plain_json(numerics)


def fingerprint_of(numerics: dict) -> str:
    return json_digest(numerics)


def run_fingerprint(study, recipe: str, seed: int, data_hash: str, init: str | None = None) -> tuple[dict, str]:
    """(what the run of ``recipe`` and ``seed`` in ``study`` on this data computes, its fingerprint)."""
    numerics = run_numerics(
        study.model,
        study.recipe(recipe),
        data_hash,
        study.experiment.train,
        seed,
        study.experiment.backend,
        init,
        study.experiment.parallel,
    )
    return numerics, fingerprint_of(numerics)


def changed_fields(old: dict, new: dict, prefix: str = "") -> list[str]:
    """The dotted names of the fields that differ between two ``run_numerics`` records."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            out += changed_fields(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [prefix.rstrip(".")]


class RunFolder:
    """``out/runs/<fingerprint>``: one run's checkpoints, parts and record."""

    def __init__(self, out: Path, fingerprint: str):
        self.out = Path(out)
        self.fingerprint = fingerprint
        self.path = self.out / RUNS / fingerprint
        self.resume = self.path / "resume"
        self.ckpt = self.path / "ckpt"
        self.record_path = self.path / "run.json"

    def relative(self, path: Path) -> str:
        """``path`` relative to ``out`` (how done.json names checkpoints)."""
        return Path(path).relative_to(self.out).as_posix()

    # ------------------------------------------------------------------------------ record
    def resume_step(self) -> int:
        """The step of the newest resume checkpoint on disk (0 without one; not verified)."""
        newest = [*resume_checkpoints(self.resume)[:1], *resume_dirs(self.resume)[:1]]  # reference, megatron
        return max((int(p.name[len("resume_") :][:8]) for p in newest), default=0)

    def record(self) -> dict | None:
        return json.loads(self.record_path.read_text()) if self.record_path.is_file() else None

    def start_attempt(self, numerics: dict, from_step: int, provenance: dict, owner: dict | None = None) -> int:
        """Record that a process starts working on this run at ``from_step``; its number among the
        processes that have worked on this run folder (0 for the first). ``owner``: the experiment,
        recipe and seed whose run it is (``check_owner`` reads it)."""
        record = self.record() or {"fingerprint": self.fingerprint, "numerics": numerics, "attempts": []}
        if owner is not None:
            record.setdefault("owner", owner)
        record["attempts"].append({"from_step": from_step, "provenance": provenance})
        atomic_write_json(self.record_path, record)
        return len(record["attempts"]) - 1

    # ------------------------------------------------------------------------------- parts
    def parts(self, kind: str) -> list[tuple[int, Path]]:
        """(last step, file) of the parts of ``kind`` (metrics or telemetry), by step."""
        folder = self.path / kind
        if not folder.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := PART.match(p.name))]
        return sorted(found)

    def drop_parts_after(self, step: int) -> None:
        for kind in ("metrics", "telemetry"):
            for last, path in self.parts(kind):
                if last > step:
                    path.unlink()

    def write_part(self, kind: str, step: int, rows: list[dict], columns: list[str], provenance: dict) -> None:
        write_table(self.path / kind / f"upto_{step:08d}.parquet", pd.DataFrame(rows, columns=columns), provenance)

    def assemble(self, kind: str, columns: list[str]) -> pd.DataFrame:
        """Every part of ``kind`` as one table, in step order."""
        tables = [pd.read_parquet(path) for _, path in self.parts(kind)]
        tables = [t for t in tables if len(t)]
        if not tables:
            return pd.DataFrame(columns=columns)
        return pd.concat(tables, ignore_index=True)[columns]


def run_owner(experiment: str, recipe: str, seed: int) -> dict:
    """Whose run a folder ``out`` holds (run.json's ``owner``, done.json's fields of the same names)."""
    return {"experiment": experiment, "recipe": recipe, "seed": seed}


def check_owner(out: Path, owner: dict) -> None:
    """An error when ``out`` holds another experiment's, recipe's or seed's run (its done.json, or
    the record of one of its run folders, says whose): two runs given one folder would replace
    each other's top-level results. Records written before runs named their owner are not read."""
    out = Path(out)
    records = (
        [(out / "done.json", json.loads((out / "done.json").read_text()))] if (out / "done.json").is_file() else []
    )
    records += [(run.record_path, run.record().get("owner")) for run in list_runs(out) if run.record()]
    for where, record in records:
        found = {key: record.get(key) for key in owner} if isinstance(record, dict) else None
        if found is not None and None not in found.values() and found != owner:
            raise FP4ReproError(
                f"{out}: holds the run of recipe {found['recipe']!r} seed {found['seed']} of experiment "
                f"{found['experiment']!r} ({where}); recipe {owner['recipe']!r} seed {owner['seed']} of "
                f"experiment {owner['experiment']!r} would replace its results: give it a folder of its own (--out)"
            )


def list_runs(out: Path) -> list[RunFolder]:
    """Every run folder under ``out/runs``."""
    root = Path(out) / RUNS
    if not root.is_dir():
        return []
    return [RunFolder(out, p.name) for p in sorted(root.iterdir()) if p.is_dir()]


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def remove_run(run: RunFolder) -> None:
    """Delete a run folder (only ever called on the user's explicit request)."""
    shutil.rmtree(run.path)
