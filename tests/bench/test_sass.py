"""`fp4repro bench sass`: the quantization kernel compiled for sm_90 on this machine (no GPU).

It runs in a subprocess without TRITON_INTERPRET (which conftest sets for the CPU tests): the
kernels differ under the interpreter (no inline PTX), and the counts are of what a GPU runs.
"""

import json
import os
import subprocess
import sys

import pytest

from fp4repro.bench.kernels import CASES
from fp4repro.bench.sass import count_instructions


def test_counts_every_held_case_and_sr_stays_near_rne(tmp_path):
    out = tmp_path / "sass.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "fp4repro.cli", "bench", "sass", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["arch"] == "sm_90"
    rows = {r["case"]: r for r in result["cases"]}
    assert set(rows) == {name for name, (_, held, _) in CASES.items() if held}
    for r in rows.values():
        assert 0 < r["main"] <= r["total"] and 0 < r["registers"] <= 255
        assert r["fp_fusion"] is False  # compiled as launched: no FMA contraction
        assert sum(r["mix"].values()) == r["main"] and r["mix"]["EXIT"] == 1
    assert "1x16 SR, held amax" in proc.stdout
    # SR rounds by an integer carry, 7 instructions per element: 1.33x the RNE kernel on sm_90
    # with Triton 3.6 (496 vs 374). The reference's floor/compare form in the kernel was 1.73x
    # (0.60 of copy against 0.73 on an H200): this fails if SR falls back to anything like it.
    assert rows["1x16 SR, held amax"]["main"] <= 1.4 * rows["1x16 RNE, held amax"]["main"]
    # one Philox call per 8 elements a thread holds: no call computed by two threads. Column-wise
    # tiles laid out (TILE_C, TILE_R) split each 8-group's bytes over two warps and made 2.00.
    sr = [r for name, r in rows.items() if CASES[name][0].stochastic]
    assert len(sr) == 4 and all(r["philox_per_8_elements"] == 1.0 for r in sr)
    assert all(r["philox_per_8_elements"] is None for name, r in rows.items() if not CASES[name][0].stochastic)
    # the telemetry variants: each tile stores its counters in a slot of its own, no global atomic
    # (six per tile on the same six addresses before); read to their EXIT although the column-wise
    # ones run past 4,096 instructions (address 0x10000), where Triton's own listing stops
    for r in rows.values():
        t = r["telemetry"]
        assert t["global_atomics"] == 0 and t["main"] > r["main"] and 0 < t["registers"] <= 255, r["case"]
    assert rows["1x16 RNE, column-wise (wgrad)"]["telemetry"]["main"] > 4096
    assert "with telemetry (stats=True)" in proc.stdout


def _line(address: int, instruction: str) -> str:
    """One instruction as ``cuobjdump -sass`` prints it, with its encoding's two comment lines."""
    return (
        f"        /*{address:04x}*/                   {instruction} ;   /* 0x000fe200078e00ff */\n{' ' * 80}/* 0x0 */\n"
    )


def test_count_instructions_reads_the_main_path_up_to_exit():
    header = '\tcode for sm_90\n\t\tFunction : _quantize_kernel\n\t.headerflags\t@"EF_CUDA_SM90"\n'
    sass = header + "".join(
        _line(16 * i, op)
        for i, op in enumerate(
            ["LDC R1, c[0x0][0x28]", "@!P0 FADD R2, R2, R3", "STL [R1], R2", "EXIT", "BRA 0x40", "LDL R2, [R1]"]
        )
    )
    assert count_instructions(sass) == {
        "main": 4,
        "total": 6,
        "mix": {"LDC": 1, "FADD": 1, "STL": 1, "EXIT": 1},
        "umulhi": 0,
        "global_atomics": 0,
        "local_memory": 2,  # the whole listing's: the LDL after EXIT too
    }
    # addresses past 0xffff read on; RED and ATOMG are global atomics, REDUX (within a warp) is not
    late = [
        "IMAD.HI.U32 R4, R2, -0x2da96c6d, RZ",
        "IMAD.HI R5, R2, R3, RZ",
        "RED.E.ADD.STRONG.GPU [R2.64], R5",
        "ATOMG.E.ADD.STRONG.GPU PT, R7, [R2.64], R5",
        "REDUX.SUM UR4, R5",
        "EXIT",
        "IMAD.HI.U32 R4, R2, R3, RZ",
        "RED.E.ADD.STRONG.GPU [R2.64], R5",
    ]
    counts = count_instructions(header + "".join(_line(0xFFF0 + 16 * i, op) for i, op in enumerate(late)))
    assert counts["umulhi"] == 1 and counts["global_atomics"] == 3 and counts["main"] == 6
    assert counts["mix"] == {"IMAD": 2, "RED": 1, "ATOMG": 1, "REDUX": 1, "EXIT": 1}
    with pytest.raises(ValueError, match="no EXIT"):
        count_instructions(header)
