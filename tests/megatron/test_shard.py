"""A whole megatron state dict cut into tensor-parallel parts and put together again: each rank's
part loads into megatron's model at tensor size 2 (strict), the parts gather back to the whole
bit for bit, and every tensor a rank holds is, by megatron's own checkpoint metadata
(``sharded_state_dict``: each piece's offset in the whole tensor, Mamba's fused in_proj and conv1d
split into their segments), the piece of the whole tensor it should be."""

import contextlib

import torch


def _pieces(sharded: dict):
    """Every ShardedTensor of a sharded state dict, factories built into their pieces."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    stack = list(sharded.values())
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, ShardedTensorFactory):
            stack.append(item.build())
        elif isinstance(item, ShardedTensor):
            yield item


def _segments_of(config):
    """Mamba's fused tensors' segments in the whole tensor (name -> (start, size)), megatron's names."""
    d, bc, h = config.mamba_d_inner, config.mamba_groups * config.mamba_state_size, config.mamba_heads
    in_proj = dict(z=(0, d), x=(d, d), B=(2 * d, bc), C=(2 * d + bc, bc), dt=(2 * d + 2 * bc, h))
    conv = dict(x=(0, d), B=(d, bc), C=(d + bc, bc))
    return in_proj, conv


def _worker(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from cpu_build import build, cpu_adaptations
    from megatron.core import parallel_state, tensor_parallel

    from fp4repro.config.model import load_model_config
    from fp4repro.config.parallel import ParallelConfig
    from fp4repro.megatron.convert import to_megatron
    from fp4repro.megatron.shard import gather, shard
    from fp4repro.model import NemotronH

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    with contextlib.ExitStack() as teardown:
        teardown.callback(dist.destroy_process_group)
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
        teardown.callback(parallel_state.destroy_model_parallel)
        tensor_parallel.model_parallel_cuda_manual_seed(0, inference_rng_tracker=True)
        cpu_adaptations()
        config = load_model_config("tiny")
        torch.manual_seed(3)
        whole = to_megatron(NemotronH(config).state_dict(), config)
        model = build(config, "cpu", ParallelConfig(tensor=2))
        model.load_state_dict(shard(whole, config, 2, rank), strict=True)
        local = {k: v for k, v in model.state_dict().items() if not k.endswith("._extra_state")}
        back = gather(local, config, parallel_state.get_tensor_model_parallel_group())
        checks = {
            "gathered": sorted(k for k in whole if torch.equal(back[k], whole[k])),
            "split": sorted(k for k in whole if local[k].shape != whole[k].shape),
        }
        in_proj, conv = _segments_of(config)
        wrong, seen = [], 0
        for piece in _pieces(model.sharded_state_dict()):
            key, segment = piece.key, None
            if key not in whole:  # a fused tensor's segment: "<key>.<segment>"
                key, name = key.rsplit(".", 1)
                segment = (in_proj if key.endswith("in_proj.weight") else conv)[name]
            source = whole[key] if segment is None else whole[key].narrow(0, *segment)
            offsets = piece.global_offset[-piece.data.dim() :]
            expected = source[tuple(slice(o, o + n) for o, n in zip(offsets, piece.data.shape))]
            seen += 1
            if not torch.equal(piece.data, expected):
                wrong.append(piece.key)
        checks.update(wrong=wrong, pieces=seen)
        torch.save(checks, f"{out}.{rank}")


def test_tensor_parallel_parts_are_megatrons_and_gather_to_the_whole(tmp_path):
    import torch.multiprocessing as mp

    from fp4repro.config.model import load_model_config
    from fp4repro.megatron.convert import key_map

    out = str(tmp_path / "shard")
    mp.start_processes(_worker, args=(f"file://{tmp_path}/rendezvous", out), nprocs=2, start_method="spawn", join=True)
    config = load_model_config("tiny")
    every = set(key_map(config).values())
    for rank in (0, 1):
        checks = torch.load(f"{out}.{rank}")
        assert set(checks["gathered"]) == every
        assert checks["wrong"] == [] and checks["pieces"] > len(every)
        split = set(checks["split"])
        assert "decoder.layers.0.mixer.in_proj.weight" in split and "decoder.layers.1.mlp.linear_fc1.weight" in split
        assert not any(k.endswith(("norm.weight", "layernorm.weight")) and ".mixer." not in k for k in split)
