"""Mamba-2's state-space recurrence (SSD), in plain torch.

For each head h with scalar decay A_h < 0, and per time step t the step size dt_t > 0, the input
x_t (head_dim P), and the group's B_t, C_t (state size N):

    S_t = exp(dt_t · A_h) · S_{t-1} + dt_t · x_t ⊗ B_t        S_t: (P, N), S_{-1} = initial state
    y_t = S_t · C_t + D_h · x_t

`ssd_sequential` runs this recurrence step by step (the definition; used as the reference in
tests). `ssd_chunked` computes the same thing with the chunked "state space duality" algorithm
of Mamba-2 (Dao & Gu, 2024): quadratic attention-like products inside chunks of Q steps, and
the recurrence only across chunk boundaries. On CUDA, mamba-ssm's Triton kernel
`mamba_chunk_scan_combined` implements the same algorithm; this module is the fallback that
always runs on CPU.

Shapes (b batch, l length, h heads, p head_dim, g groups, n state size):
    x (b, l, h, p), dt (b, l, h), A (h,), B and C (b, l, g, n), D (h,)
Heads are assigned to groups in contiguous runs: head i uses group i // (h / g), as in mamba-ssm.
Computation is in float32 (float64 if x is float64); the output has x's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def ssd_sequential(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-by-step recurrence. Returns y (b, l, h, p) in x's dtype and the final state (b, h, p, n).

    O(l) sequential steps: a reference, not for training.
    """
    dtype, out_dtype = _compute_dtype(x), x.dtype
    b, length, h, p = x.shape
    g, n = B.shape[-2:]
    heads_per_group = h // g
    x, dt, A = x.to(dtype), dt.to(dtype), A.to(dtype)
    # Give every head its group's B and C: (b, l, g, n) -> (b, l, h, n).
    B = B.to(dtype).repeat_interleave(heads_per_group, dim=2)
    C = C.to(dtype).repeat_interleave(heads_per_group, dim=2)
    state = torch.zeros(b, h, p, n, dtype=dtype, device=x.device) if initial_state is None else initial_state.to(dtype)
    ys = []
    for t in range(length):
        decay = torch.exp(dt[:, t] * A)  # (b, h)
        state = decay[..., None, None] * state + torch.einsum("bh,bhp,bhn->bhpn", dt[:, t], x[:, t], B[:, t])
        ys.append(torch.einsum("bhpn,bhn->bhp", state, C[:, t]))
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + D.to(dtype)[:, None] * x
    return y.to(out_dtype), state


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD. Returns y (b, l, h, p) in x's dtype and the final state (b, h, p, n) in float32/64.

    With a_t = dt_t · A_h and the within-chunk cumulative sum Λ_i = a_1 + … + a_i (chunk of Q steps,
    positions i, j in 1..Q), the output of position i in chunk c is

        y_i = Σ_{j ≤ i} (C_i · B_j) · exp(Λ_i − Λ_j) · dt_j · x_j        (intra-chunk, "diagonal")
            + exp(Λ_i) · S_c · C_i                                         (state entering chunk c)
            + D · x_i

    and the states entering each chunk follow a recurrence over chunks only:

        S_{c+1} = exp(Λ_Q) · S_c + Σ_j exp(Λ_Q − Λ_j) · dt_j · x_j ⊗ B_j.

    A length that is not a multiple of chunk_size is zero-padded at the end: padded steps have
    dt = 0, i.e. no decay and no input, so they change neither earlier outputs nor the final state.
    """
    dtype = _compute_dtype(x)
    batch, length, heads, head_dim = x.shape
    groups, state_size = B.shape[-2:]
    per_group = heads // groups
    Q = chunk_size
    n_chunks = -(-length // Q)
    pad = n_chunks * Q - length

    def chunked(t: torch.Tensor) -> torch.Tensor:
        # (b, l, ...) -> (b, chunks, Q, ...), zero-padded at the end of the sequence
        t = t.to(dtype)
        if pad:
            t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
        return t.reshape(batch, n_chunks, Q, *t.shape[2:])

    # Split heads into (group, head within group) so that B and C are shared without copies.
    xc = chunked(x).reshape(batch, n_chunks, Q, groups, per_group, head_dim)  # b c l g r p
    dtc = chunked(dt).reshape(batch, n_chunks, Q, groups, per_group)  # b c l g r
    Bc, Cc = chunked(B), chunked(C)  # b c l g n
    a = dtc * A.to(dtype).reshape(groups, per_group)  # b c l g r
    cum = torch.cumsum(a, dim=2)  # Λ, b c l g r

    # Intra-chunk: decay[i, j] = exp(Λ_i − Λ_j) for j ≤ i, else 0. Differences of a cumulative sum
    # over at most Q steps keep float32 accurate (the Triton kernel does the same); the upper
    # triangle is masked *before* exp so that exp never sees a large positive number.
    lam = cum.permute(0, 1, 3, 4, 2)  # b c g r l
    causal = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    decay = torch.exp((lam[..., :, None] - lam[..., None, :]).masked_fill(~causal, float("-inf")))
    CB = torch.einsum("bclgn,bcsgn->bcgls", Cc, Bc)  # C_i · B_j
    weights = CB[:, :, :, None] * decay * dtc.permute(0, 1, 3, 4, 2)[..., None, :]  # b c g r l s
    y = torch.einsum("bcgrls,bcsgrp->bclgrp", weights, xc)

    # State contributed by each chunk on its own, at the chunk's end.
    decay_to_end = torch.exp(cum[:, :, -1:] - cum) * dtc  # b c l g r
    chunk_states = torch.einsum("bclgn,bclgr,bclgrp->bcgrpn", Bc, decay_to_end, xc)

    # Recurrence across chunks (n_chunks sequential steps, each a cheap elementwise update).
    if initial_state is None:
        state = torch.zeros(batch, groups, per_group, head_dim, state_size, dtype=dtype, device=x.device)
    else:
        state = initial_state.to(dtype).reshape(batch, groups, per_group, head_dim, state_size)
    chunk_decay = torch.exp(cum[:, :, -1])  # b c g r
    entering = []
    for c in range(n_chunks):
        entering.append(state)
        state = chunk_decay[:, c, :, :, None, None] * state + chunk_states[:, c]
    entering_states = torch.stack(entering, dim=1)  # b c g r p n

    # Inter-chunk: the state entering the chunk, decayed to position i and read out through C_i.
    y = y + torch.einsum("bclgn,bcgrpn,bclgr->bclgrp", Cc, entering_states, torch.exp(cum))

    y = y.reshape(batch, n_chunks * Q, heads, head_dim)[:, :length]
    if D is not None:
        y = y + D.to(dtype)[:, None] * x.to(dtype)
    return y.to(x.dtype), state.reshape(batch, heads, head_dim, state_size)
