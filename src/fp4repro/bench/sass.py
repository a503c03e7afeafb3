"""Instruction counts of the quantization kernels, compiled for a GPU architecture on any machine.

A memory-bound kernel runs at the copy bandwidth; one that issues too many instructions per byte
does not, whatever its memory traffic. This counts, without a GPU, what each thread of
``_quantize_kernel`` issues: Triton compiles the kernel exactly as its JIT would for the
arguments of ``fp4repro.kernels.quantize_2d`` (same specialization, same constexprs and launch
plan), for the chosen architecture (default sm_90, the H200), and the SASS comes from the
``cuobjdump`` that Triton ships. Counted: the main path, the instructions up to the first
``EXIT`` (the straight-line code every thread runs once: the kernel has no loops; the slow path
of the IEEE division follows it and runs only for operands that need it), per thread and per
element of the thread's share of the tile, the opcodes that take most of them, and registers.
For SR, the Philox calls each thread computes per 8 of its elements (1 when no thread computes
a call another thread also computes): each of Philox2x32-10's rounds takes one ``IMAD.HI.U32``
(its ``umulhi``), and no other part of the kernel issues one.

Each case is also compiled with telemetry (``quantize_2d(..., stats=True)``, the variant a
telemetry step runs): its main path, registers, global atomics (``ATOMG``/``RED``), which it
has none of (each tile writes its counters to a slot of its own), and local-memory loads and
stores (``LDL``/``STL``: registers spilled), both over the whole listing.

The cases are those of ``fp4repro bench kernels`` (BF16 input and q·s output).
"""

from __future__ import annotations

import collections
import re
import subprocess
import tempfile
from pathlib import Path

import torch

from fp4repro.provenance import provenance
from fp4repro.results import write_json

# an instruction line of ``cuobjdump -sass``: /*address*/ [predicate] OPCODE.MODIFIERS operands ;
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\S*)")
PHILOX_ROUNDS = 10


def compile_case(
    spec, shape: tuple[int, int], columnwise: bool, arch: int = 90, live: bool = False, stats: bool = False
):
    """(CompiledKernel, elements per thread) of what ``quantize_2d`` launches for a BF16 tensor of
    ``shape`` (row-major, or a column-major view when ``columnwise``) with a held amax (none for
    formats without a tensor scale), compiled for sm_``arch``; ``live``: the variant that also
    max-folds the live tensor amax into running slots (``quantize_2d(..., live=slots)``);
    ``stats``: the variant that also counts telemetry (``quantize_2d(..., stats=True)``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    from fp4repro.kernels import live_slots, quantize, quantize_launch
    from fp4repro.kernels.launch import COMPILE_OPTIONS

    if quantize.INTERPRETED:
        raise RuntimeError(
            "TRITON_INTERPRET is set: the kernels were defined for Triton's interpreter "
            "(no inline PTX); unset it to count what the GPU runs"
        )
    rows, cols = shape
    x = torch.empty((cols, rows) if columnwise else shape, dtype=torch.bfloat16, device="meta")
    x = x.t() if columnwise else x
    amax = torch.empty((), dtype=torch.float32, device="meta")  # held: no reduction pass
    slots = live_slots("meta") if live else None
    (_, args, constexprs, num_warps), _ = quantize_launch(x, spec, amax=amax, seed=1, live=slots, stats=stats)
    fn = quantize._quantize_kernel
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    kwargs = dict(constexprs, num_warps=num_warps, **dict(COMPILE_OPTIONS))
    bound, specialization, options = create_function_from_signature(fn.signature, fn.params, backend)(*args, **kwargs)
    options, signature, constants, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    kernel = triton.compile(ASTSource(fn, signature, constants, attrs), target=target, options=options.__dict__)
    named = dict(constexprs)
    return kernel, named["TILE_R"] * named["TILE_C"] // (32 * num_warps)


def count_instructions(sass: str) -> dict:
    """Main-path and total instruction counts, the main path's opcode mix and its ``IMAD.HI.U32``
    count (``umulhi``), and the whole listing's global atomics (``ATOMG``, ``RED``: not the warp
    reduction ``REDUX``) and local-memory loads and stores (``LDL``, ``STL``) of one kernel's SASS."""
    matches = [m for m in map(_INSTRUCTION.match, sass.splitlines()) if m]
    opcodes = [m.group(1) for m in matches]
    if "EXIT" not in opcodes:
        raise ValueError("no EXIT in the SASS: not a kernel listing")
    main = matches[: opcodes.index("EXIT") + 1]
    return {
        "main": len(main),
        "total": len(opcodes),
        "mix": dict(collections.Counter(m.group(1) for m in main).most_common()),
        "umulhi": sum(m.group(1) + m.group(2) == "IMAD.HI.U32" for m in main),
        "global_atomics": sum(m.group(1) in ("ATOMG", "RED") for m in matches),
        "local_memory": sum(m.group(1) in ("LDL", "STL") for m in matches),
    }


def _cuobjdump(cubin: bytes, option: str) -> str:
    """What the ``cuobjdump`` Triton ships prints for a cubin with ``option``."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run(
            [knobs.nvidia.cuobjdump.path, option, str(path)], capture_output=True, text=True, check=True
        ).stdout


def sass_listing(cubin: bytes) -> str:
    """The SASS of the kernel in a cubin, as ``cuobjdump -sass`` prints it. Not Triton's own
    listing (``asm["sass"]``): its parser reads four hex digits of address and stops at 0x10000,
    before the EXIT of a kernel longer than 4,096 instructions, as the column-wise telemetry
    variants are."""
    return _cuobjdump(cubin, "-sass")


def registers(cubin: bytes) -> int:
    """Registers per thread of the kernel in a cubin (``cuobjdump --dump-resource-usage``)."""
    return int(re.search(r"REG:(\d+)", _cuobjdump(cubin, "--dump-resource-usage")).group(1))


def run(shape: tuple[int, int] = (8192, 8192), arch: int = 90, out: Path | None = None) -> dict:
    """Counts for every held-amax case of ``fp4repro bench kernels``; JSON to ``out``."""
    from fp4repro.bench.kernels import CASES

    rows = []
    for name, (spec, held, columnwise) in CASES.items():
        if not held:
            continue
        kernel, elements = compile_case(spec, shape, columnwise, arch)
        counts = count_instructions(sass_listing(kernel.asm["cubin"]))
        with_stats = compile_case(spec, shape, columnwise, arch, stats=True)[0]
        stats_counts = count_instructions(sass_listing(with_stats.asm["cubin"]))
        rows.append(
            {
                "case": name,
                "elements_per_thread": elements,
                "registers": registers(kernel.asm["cubin"]),
                "per_element": counts["main"] / elements,
                "philox_per_8_elements": counts["umulhi"] / PHILOX_ROUNDS / (elements / 8) if spec.stochastic else None,
                "fp_fusion": bool(kernel.metadata.enable_fp_fusion),
                **counts,
                "telemetry": {
                    "main": stats_counts["main"],
                    "per_element": stats_counts["main"] / elements,
                    "registers": registers(with_stats.asm["cubin"]),
                    "global_atomics": stats_counts["global_atomics"],
                    "local_memory": stats_counts["local_memory"],
                },
            }
        )
    result = {"arch": f"sm_{arch}", "shape": list(shape), "cases": rows}
    if out is not None:
        write_json(out, result, provenance(None))
    return result


def table(result: dict) -> str:
    """The benchmark's table, as `fp4repro bench` prints it, from its JSON record."""
    lines = []
    lines.append(
        f"SASS of _quantize_kernel for {result['arch']}, BF16 {'x'.join(map(str, result['shape']))}, held amax"
    )
    lines.append(f"{'case':34} {'main path':>9} {'per elem':>8} {'regs':>5} {'Philox/8':>8}  most issued")
    for r in result["cases"]:
        top = ", ".join(f"{op} {n}" for op, n in list(r["mix"].items())[:4])
        philox = r.get("philox_per_8_elements")
        philox = "" if philox is None else f"{philox:.2f}"
        lines.append(f"{r['case']:34} {r['main']:>9} {r['per_element']:>8.1f} {r['registers']:>5} {philox:>8}  {top}")
    with_telemetry = [r for r in result["cases"] if "telemetry" in r]
    if with_telemetry:
        lines.append("")
        lines.append("with telemetry (stats=True)")
        lines.append(f"{'case':34} {'main path':>9} {'per elem':>8} {'regs':>5} {'atomics':>8} {'LDL/STL':>8}")
        for r in with_telemetry:
            t = r["telemetry"]
            lines.append(
                f"{r['case']:34} {t['main']:>9} {t['per_element']:>8.1f} {t['registers']:>5} "
                f"{t['global_atomics']:>8} {t['local_memory']:>8}"
            )
    return "\n".join(lines)
