"""Launch a Triton kernel without paying the JIT's argument binding on every call.

``kernel[grid](*args, **constexprs)`` binds and specializes every argument on every call and then
looks the compiled kernel up; for the quantization kernel (17 runtime and 29 constexpr arguments)
that host time is several times the driver launch itself (measured on an H200: results/bench/README.md, *Triton
kernels (one H200)*). An emulated FP4 linear issues six quantizations per step, so the binder
alone would cost about as much host time as the whole BF16 step.

``Launcher`` keeps, per key, the ``CompiledKernel`` the JIT produced and afterwards calls it
directly. The key holds the current device and everything Triton compiles differently for: the
constexpr values, the launch options, each tensor's dtype and whether its address is 16-byte
aligned, and each integer's type range, whether it is 1 and whether it divides by 16 (Triton
specializes on alignment and divisibility by 16). It distinguishes at least as much as Triton does, so a
cached kernel is only
ever reused for arguments Triton would have compiled identically; a miss goes through the JIT,
which compiles (or finds) the kernel and launches it.

The direct call is the ``CompiledKernel.run`` protocol of Triton 3.x (grid, stream, function,
metadata, hooks, arguments in signature order). With another Triton, with Triton's debug mode on,
or while a launch hook is installed (profilers such as Proton), every launch goes through the JIT.
"""

from __future__ import annotations

import inspect

import torch

_INT32 = range(-(2**31), 2**31)
#: Compile options of every kernel of this package. No FMA contraction: the kernels must round
#: exactly as the torch reference does, one IEEE operation at a time, and bit-exactness should
#: not depend on where LLVM would fuse a multiply into an add (Triton fuses by default).
COMPILE_OPTIONS = (("enable_fp_fusion", False),)


def _arg_key(arg):
    """What Triton specializes a runtime argument on (a superset of it)."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if isinstance(arg, bool):
        return bool, arg
    if isinstance(arg, int):
        return arg in _INT32, arg >= 2**63, arg == 1, arg % 16 == 0
    return type(arg)


def _hooked(hook) -> bool:
    """Whether a launch hook is installed (Triton 3.6 keeps a ``HookChain``, empty by default)."""
    return bool(getattr(hook, "calls", hook))


class Launcher:
    """``Launcher(jit_fn)(grid, args, constexprs, num_warps)``: run ``jit_fn`` on ``grid``.

    args: the runtime arguments in signature order; constexprs: the constexpr arguments as a
    tuple of (name, value) pairs (hashable: callers build it once per configuration). Every
    constexpr parameter comes after the runtime ones in the kernel's signature, as in this
    package's kernels. Under ``TRITON_INTERPRET=1`` every launch goes through the interpreter.
    """

    def __init__(self, jit_fn) -> None:
        import triton
        from triton import knobs

        self.jit_fn = jit_fn
        self.names = tuple(jit_fn.arg_names)
        self.defaults = {
            name: p.default
            for name, p in inspect.signature(jit_fn.fn).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
        self.direct = triton.__version__.split(".")[0] == "3" and not knobs.runtime.interpret
        self._compiled: dict[tuple, tuple] = {}

    def __call__(self, grid: tuple[int, ...], args: tuple, constexprs: tuple, num_warps: int) -> None:
        from triton import knobs
        from triton.runtime import driver

        if not self.direct:
            self.jit_fn[grid](*args, **dict(constexprs), num_warps=num_warps, **dict(COMPILE_OPTIONS))
            return
        device = driver.active.get_current_device()  # a compiled kernel is loaded per device
        key = (device, num_warps, constexprs, tuple(map(_arg_key, args)))
        hit = self._compiled.get(key)
        runtime = knobs.runtime
        if hit is None or runtime.debug or _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
            named = dict(constexprs)
            compiled = self.jit_fn[grid](*args, **named, num_warps=num_warps, **dict(COMPILE_OPTIONS))
            if compiled is not None and hasattr(compiled, "run"):
                self._compiled[key] = (
                    compiled,
                    tuple(named[name] if name in named else self.defaults[name] for name in self.names[len(args) :]),
                )
            return
        compiled, const_values = hit
        grid = tuple(grid) + (1,) * (3 - len(grid))
        compiled.run(
            grid[0],
            grid[1],
            grid[2],
            driver.active.get_current_stream(device),
            compiled.function,
            compiled.packed_metadata,
            None,
            None,
            None,
            *args,
            *const_values,
        )
