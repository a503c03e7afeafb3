"""Tensor parallelism quantizes as one process does: two gloo processes hold halves of a tensor
(split as a column-parallel linear splits N, or a row-parallel one K); with the amax reduced over
the group each half's quantized operand is bit for bit the same half of the whole tensor's, with
each shard's own amax (tp_amax: local) it is not. And megatron's quantized MLP pair at tensor
size 2 computes the tensor-size-1 reference MLP, its split operands reducing amaxes over the group,
with sequence parallelism too; so does its attention with the paper's separate q/k/v linears."""

import contextlib

import torch

SHAPE = (64, 96)


def _tensor(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SHAPE, generator=g)
    x[3, 5] = 40.0  # the whole tensor's amax lies in the first half of rows and columns
    return x


@contextlib.contextmanager
def _gloo(rank: int, init: str):
    """This worker in a two-process gloo group for the block's duration."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def _operands(rank: int, init: str, out: str) -> None:
    from fp4repro.config.recipe import load_recipe
    from fp4repro.quant.linear import Shard, quantized_operand

    with _gloo(rank, init) as dist:
        specs = load_recipe("nvfp4").linear_specs(0, 4, linear="fc1")
        results = {}
        for name, spec in (
            ("fprop.w (16x16)", specs.fprop_w),
            ("fprop.x (1x16)", specs.fprop_x),
            ("dgrad.w (RHT off, 16x16)", specs.dgrad_w),
            ("wgrad.x (RHT)", specs.wgrad_x),
        ):
            x = _tensor(len(name))
            rows = x[rank * 32 : (rank + 1) * 32]  # N split: rows of W
            cols = x[:, rank * 48 : (rank + 1) * 48]  # K split: columns
            for split, shard in (("rows", rows), ("cols", cols)):
                for mode, group in (("group", dist.group.WORLD), ("local", None)):
                    q, d = quantized_operand(shard.contiguous(), spec, None, "l", "op", Shard(group))
                    results[name, split, mode] = (q * d).float()
        torch.save(results, f"{out}.{rank}")


def test_split_operands_quantize_as_the_whole_tensor_with_the_group_amax(tmp_path):
    import torch.multiprocessing as mp

    from fp4repro.config.recipe import load_recipe
    from fp4repro.quant.linear import quantized_operand

    out = str(tmp_path / "operands")
    mp.start_processes(
        _operands, args=(f"file://{tmp_path}/rendezvous", out), nprocs=2, start_method="spawn", join=True
    )
    ranks = [torch.load(f"{out}.{rank}") for rank in (0, 1)]
    specs = load_recipe("nvfp4").linear_specs(0, 4, linear="fc1")
    for name, spec in (
        ("fprop.w (16x16)", specs.fprop_w),
        ("fprop.x (1x16)", specs.fprop_x),
        ("dgrad.w (RHT off, 16x16)", specs.dgrad_w),
        ("wgrad.x (RHT)", specs.wgrad_x),
    ):
        q, d = quantized_operand(_tensor(len(name)), spec, None, "l", "op")
        whole = (q * d).float()
        for split, halves in (("rows", whole.split(32, dim=0)), ("cols", whole.split(48, dim=1))):
            for rank in (0, 1):
                assert torch.equal(ranks[rank][name, split, "group"], halves[rank]), (name, split, rank)
            # the half without the amax scales by its own, smaller one: other values
            assert not torch.equal(ranks[1][name, split, "local"], halves[1]), (name, split)


def _rne(specs):
    """The recipe's specs with round-to-nearest everywhere and the FP32 GEMM. On a CPU, stochastic
    rounding draws from a generator of the shard's own shape (the kernels draw at the shard's place
    in the whole tensor: tests/kernels/test_quantize_kernels.py), so SR operands are the same at
    every tensor size only on a GPU. With the probe-matched GEMM a row-parallel GEMM rounds each
    rank's share of K to the lattice before the all-reduce, as FP4 tensor cores would: then only
    the FP32 GEMM makes tensor size 2 the whole GEMM up to the order of FP32 sums."""
    import dataclasses

    from fp4repro.config.spec import GemmModel

    rne = {
        name.replace(".", "_"): dataclasses.replace(spec, rounding="rne")
        for name, spec in specs.items()
        if spec is not None
    }
    return dataclasses.replace(specs, **rne, gemm=GemmModel("fp32"))


@contextlib.contextmanager
def _megatron_tensor_size_2(rank: int, init: str):
    """This worker as rank ``rank`` of megatron's tensor group of two (gloo, CPU builds) for the
    block's duration."""
    from cpu_build import cpu_adaptations
    from megatron.core import parallel_state, tensor_parallel

    with _gloo(rank, init), contextlib.ExitStack() as teardown:
        teardown.callback(parallel_state.destroy_model_parallel)
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
        tensor_parallel.model_parallel_cuda_manual_seed(0, inference_rng_tracker=True)
        cpu_adaptations()
        yield


def _mlp_at_tensor_size_2(rank: int, init: str, out: str) -> None:
    from cpu_build import build_on

    from fp4repro.config.model import ModelConfig
    from fp4repro.config.parallel import ParallelConfig
    from fp4repro.config.recipe import load_recipe
    from fp4repro.megatron.model import transformer_config
    from fp4repro.quant.state import QuantState

    with _megatron_tensor_size_2(rank, init):
        from megatron.core.transformer.mlp import MLP, MLPSubmodules

        from fp4repro.megatron.linear import QuantColumnParallelLinear, QuantRowParallelLinear
        from fp4repro.megatron.model import linear_shards

        config = ModelConfig(**MLP_MODEL)
        mlps = {}
        for sequence_parallel in (False, True):
            with build_on("cpu"):
                mlps[sequence_parallel] = MLP(
                    transformer_config(
                        config, ParallelConfig(tensor=2, sequence_parallel=sequence_parallel), cpu_initialization=True
                    ),
                    MLPSubmodules(linear_fc1=QuantColumnParallelLinear, linear_fc2=QuantRowParallelLinear),
                )
        w1, w2, x, dy = _mlp_inputs()
        half, length = w1.shape[0] // 2, x.shape[1] // 2
        recipe = load_recipe("nvfp4")
        results = {}
        for mode in ("group", "local", "sequence"):
            # sequence: tp_amax group with sequence parallelism, each rank given its half of the
            # sequence (megatron's [sequence, batch, hidden]) and its half of the output's gradient
            mlp = mlps[mode == "sequence"]
            part = slice(rank * length, (rank + 1) * length) if mode == "sequence" else slice(None)
            with torch.no_grad():
                mlp.linear_fc1.weight.copy_(w1[rank * half : (rank + 1) * half])
                mlp.linear_fc2.weight.copy_(w2[:, rank * half : (rank + 1) * half])
            mlp.zero_grad(set_to_none=True)
            state = QuantState()
            for module, linear in ((mlp.linear_fc1, "fc1"), (mlp.linear_fc2, "fc2")):
                specs = _rne(recipe.linear_specs(0, 4, linear=linear))
                tp_amax = "local" if mode == "local" else "group"
                module.attach(specs, state, linear, linear_shards(module, specs, config, linear, tp_amax))
            xs = x.transpose(0, 1)[part].clone().requires_grad_()  # megatron's [sequence, batch, hidden]
            with build_on("cpu"):  # megatron's sequence gather allocates on the "current CUDA device"
                y, _ = mlp(xs)
                y.backward(dy.transpose(0, 1)[part])
            results[mode] = {
                "y": y.detach().transpose(0, 1),
                "dx": xs.grad.transpose(0, 1),
                "dw1": mlp.linear_fc1.weight.grad.clone(),
                "dw2": mlp.linear_fc2.weight.grad.clone(),
                "groups": sorted(op for op, shard in mlp.linear_fc1.shards.items() if shard.group),
                "groups_fc2": sorted(op for op, shard in mlp.linear_fc2.shards.items() if shard.group),
            }
        torch.save(results, f"{out}.{rank}")


MLP_MODEL = dict(
    name="mlp",
    pattern="-",
    hidden_size=64,
    vocab_size=64,
    mlp_hidden_size=128,
    attn_heads=4,
    attn_kv_heads=2,
    attn_head_dim=16,
    mamba_heads=8,
    mamba_head_dim=8,
    mamba_state_size=16,
    mamba_groups=2,
    mamba_conv_kernel=4,
    mamba_chunk_size=16,
)


def _mlp_inputs():
    g = torch.Generator().manual_seed(11)
    w1, w2 = torch.randn(128, 64, generator=g) * 0.1, torch.randn(64, 128, generator=g) * 0.1
    x, dy = torch.randn(2, 32, 64, generator=g), torch.randn(2, 32, 64, generator=g)
    return w1, w2, x, dy


def test_megatrons_quantized_mlp_at_tensor_size_2_is_the_reference_mlp(tmp_path):
    import torch.multiprocessing as mp

    from fp4repro.config.recipe import load_recipe
    from fp4repro.quant.linear import QuantLinear

    out = str(tmp_path / "mlp")
    mp.start_processes(
        _mlp_at_tensor_size_2, args=(f"file://{tmp_path}/rendezvous", out), nprocs=2, start_method="spawn", join=True
    )
    modes = [torch.load(f"{out}.{rank}") for rank in (0, 1)]
    w1, w2, x, dy = _mlp_inputs()
    recipe = load_recipe("nvfp4")
    fc1 = QuantLinear(64, 128, specs=_rne(recipe.linear_specs(0, 4, linear="fc1")), name="fc1")
    fc2 = QuantLinear(128, 64, specs=_rne(recipe.linear_specs(0, 4, linear="fc2")), name="fc2")
    with torch.no_grad():
        fc1.weight.copy_(w1)
        fc2.weight.copy_(w2)
    xr = x.clone().requires_grad_()
    y = fc2(torch.relu(fc1(xr)) ** 2)
    y.backward(dy)
    ranks = [m["group"] for m in modes]
    dw1 = torch.cat([r["dw1"] for r in ranks])
    dw2 = torch.cat([r["dw2"] for r in ranks], dim=1)
    assert ranks[0]["groups"] == ["dgrad.dy", "dgrad.w", "fprop.w", "wgrad.dy"]
    assert ranks[0]["groups_fc2"] == ["dgrad.w", "fprop.w", "fprop.x", "wgrad.x"]
    # every quantized operand is the reference's: what differs is the order of FP32 sums
    # (fc2's partial products and the input gradient are all-reduced over the two ranks)
    for got, want in ((ranks[0]["y"], y), (ranks[0]["dx"], xr.grad), (dw1, fc1.weight.grad), (dw2, fc2.weight.grad)):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()
    assert torch.equal(dw1, fc1.weight.grad)  # fc1's weight gradient: one rank's GEMM, no sum
    # sequence parallelism: each rank's half of the sequence in and out, the same numbers (the
    # quantized GEMMs see the gathered sequence); BF16-free on CPU, so only FP32 sum order differs
    sequence = [m["sequence"] for m in modes]
    for got, want in (
        (torch.cat([r["y"] for r in sequence], dim=1), y),
        (torch.cat([r["dx"] for r in sequence], dim=1), xr.grad),
        (torch.cat([r["dw1"] for r in sequence]), fc1.weight.grad),
        (torch.cat([r["dw2"] for r in sequence], dim=1), fc2.weight.grad),
    ):
        assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()
    local = modes[0]["local"]
    assert local["groups"] == [] and local["groups_fc2"] == []
    # each shard scaled by its own amax (tp_amax: local): other operands, other numbers
    assert not torch.allclose(local["y"], y, rtol=1e-5, atol=1e-6)


# 8 query heads in 4 KV groups of 8 channels: two groups on each rank, so that the grouping of the
# three outputs by KV head matters within a rank
ATTENTION_MODEL = dict(
    MLP_MODEL, name="attention", pattern="*", qkv="separate", attn_heads=8, attn_kv_heads=4, attn_head_dim=8
)


def _attention_inputs():
    g = torch.Generator().manual_seed(13)
    q, k, v, o = (torch.randn(rows, 64, generator=g) * 0.1 for rows in (64, 32, 32, 64))
    x, dy = torch.randn(2, 32, 64, generator=g), torch.randn(2, 32, 64, generator=g)
    return {"q_proj": q, "k_proj": k, "v_proj": v, "o_proj": o}, x, dy


def _attention_at_tensor_size_2(rank: int, init: str, out: str) -> None:
    from cpu_build import build_on
    from megatron.core.transformer.spec_utils import build_module

    from fp4repro.config.model import ModelConfig
    from fp4repro.config.parallel import ParallelConfig
    from fp4repro.config.recipe import load_recipe
    from fp4repro.megatron.model import linear_shards, stack_spec, transformer_config
    from fp4repro.megatron.names import LINEAR_NAMES, MIXER_PATHS
    from fp4repro.megatron.shard import shard
    from fp4repro.quant.state import QuantState

    with _megatron_tensor_size_2(rank, init):
        config = ModelConfig(**ATTENTION_MODEL)
        spec = stack_spec(config).submodules.attention_layer.submodules.self_attention
        with build_on("cpu"):
            tc = transformer_config(config, ParallelConfig(tensor=2, sequence_parallel=True), cpu_initialization=True)
            attention = build_module(spec, config=tc, layer_number=1)
        weights, x, dy = _attention_inputs()
        linears = {
            "q_proj": attention.linear_qkv.linear_q,
            "k_proj": attention.linear_qkv.linear_k,
            "v_proj": attention.linear_qkv.linear_v,
            "o_proj": attention.linear_proj,
        }
        recipe, state = load_recipe("nvfp4"), QuantState()
        # this rank's part of each weight as a run cuts it from the whole state dict (q/k/v: its
        # half of the heads' rows, o_proj: their columns)
        key = {v: f"decoder.layers.0.self_attention.{MIXER_PATHS[k]}.weight" for k, v in LINEAR_NAMES.items()}
        parts = shard({key[name]: w for name, w in weights.items()}, config, 2, rank)
        with torch.no_grad():
            for name, module in linears.items():
                module.weight.copy_(parts[key[name]])
        for name, module in linears.items():
            specs = _rne(recipe.linear_specs(0, 4, linear=name))
            module.attach(specs, state, name, linear_shards(module, specs, config, name, "group"))
        part = slice(rank * 16, (rank + 1) * 16)  # sequence parallelism: this rank's half of the sequence
        xs = x.transpose(0, 1)[part].clone().requires_grad_()
        with build_on("cpu"):
            y, _ = attention(xs, attention_mask=None)
            y.backward(dy.transpose(0, 1)[part])
        # one KV head for two ranks: megatron's fused path shares the group, three linears cannot
        shared = ModelConfig(**{**ATTENTION_MODEL, "attn_kv_heads": 1})
        refused = ""
        with build_on("cpu"):
            try:
                build_module(spec, config=transformer_config(shared, ParallelConfig(tensor=2)), layer_number=1)
            except ValueError as error:
                refused = str(error)
        torch.save(
            {
                "refused": refused,
                "y": y.detach().transpose(0, 1),
                "dx": xs.grad.transpose(0, 1),
                **{f"d{name}": module.weight.grad.clone() for name, module in linears.items()},
            },
            f"{out}.{rank}",
        )


def test_megatrons_attention_with_separate_q_k_v_at_tensor_size_2_is_the_references(tmp_path):
    # each rank holds half of the query heads and the KV heads of their groups; the three outputs
    # must reach megatron's attention in its fused layout, grouped by KV head
    import torch.multiprocessing as mp

    from fp4repro.config.model import ModelConfig
    from fp4repro.config.recipe import load_recipe
    from fp4repro.model.layers import CausalSelfAttention
    from fp4repro.quant.linear import QuantLinear

    out = str(tmp_path / "attention")
    mp.start_processes(
        _attention_at_tensor_size_2,
        args=(f"file://{tmp_path}/rendezvous", out),
        nprocs=2,
        start_method="spawn",
        join=True,
    )
    ranks = [torch.load(f"{out}.{rank}") for rank in (0, 1)]
    refused = {rank.pop("refused") for rank in ranks}  # megatron's build_module names the module after it
    assert refused == {
        "separate q/k/v with 1 KV heads over tensor size 2: each rank must hold whole KV groups "
        "(KV heads a multiple of the tensor size) when instantiating SelfAttention"
    }
    weights, x, dy = _attention_inputs()
    recipe = load_recipe("nvfp4")
    reference = CausalSelfAttention(
        ModelConfig(**ATTENTION_MODEL),
        lambda i, o, name: QuantLinear(i, o, specs=_rne(recipe.linear_specs(0, 4, linear=name)), name=name),
    )
    with torch.no_grad():
        for name, w in weights.items():
            getattr(reference, name).weight.copy_(w)
    xr = x.clone().requires_grad_()
    y = reference(xr)
    y.backward(dy)
    got = {
        "y": torch.cat([r["y"] for r in ranks], dim=1),
        "dx": torch.cat([r["dx"] for r in ranks], dim=1),
        **{f"d{name}": torch.cat([r[f"d{name}"] for r in ranks]) for name in ("q_proj", "k_proj", "v_proj")},
        "do_proj": torch.cat([r["do_proj"] for r in ranks], dim=1),
    }
    want = {"y": y, "dx": xr.grad, **{f"d{name}": getattr(reference, name).weight.grad for name in weights}}
    # every quantized operand is the reference's: what differs is the order of FP32 sums
    for key, value in want.items():
        assert got[key].shape == value.shape and torch.allclose(got[key], value, rtol=1e-5, atol=1e-6), (
            key,
            (got[key] - value).abs().max(),
        )


def _refresh(rank: int, init: str, out: str) -> None:
    from fp4repro.config.recipe import load_recipe
    from fp4repro.quant.linear import quantized_operand
    from fp4repro.quant.state import QuantState

    with _gloo(rank, init) as dist:

        def world_max(value):
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
            return value

        spec = load_recipe("ue5m3_t448").linear_specs(0, 4, linear="fc1").fprop_x  # periodic amax
        state = QuantState()
        state.reduce_max = world_max
        x = _tensor(rank) * (1 + rank)  # each rank's own batch: other amaxes
        quantized_operand(x, spec, state, "l", "fprop.x")
        torch.save(state.state_dict()["held"], f"{out}.{rank}")


def test_a_refresh_holds_the_amax_of_every_data_parallel_rank(tmp_path):
    import torch.multiprocessing as mp

    out = str(tmp_path / "held")
    mp.start_processes(_refresh, args=(f"file://{tmp_path}/rendezvous", out), nprocs=2, start_method="spawn", join=True)
    held = [torch.load(f"{out}.{rank}")["l.fprop.x"] for rank in (0, 1)]
    from fp4repro.reference.block import tensor_amax

    assert torch.equal(held[0], held[1]) and torch.equal(held[0], tensor_amax(_tensor(1) * 2))
