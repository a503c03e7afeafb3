"""The megatron backend: Nemotron-H as megatron-core's hybrid ``MambaModel``, its linears running
the recipe's quantized GEMMs.

One job per module, and megatron-core imported only where it is used (importing it takes seconds):

    names    megatron's layer numbers and linear names <-> the reference model's (no megatron import)
    convert  state_dict layouts: the reference model's <-> megatron's (no megatron import)
    linear   ColumnParallelLinear / RowParallelLinear whose ``_forward_impl`` runs the quantized GEMMs
    main_grad_linear  the unquantized linears' GEMMs under autocast, weight gradient into main_grad
    attention  causal GQA through torch's SDPA in megatron's core-attention slot
    norm     the reference's RMSNorm with megatron's module signature (sequence-parallel aware)
    mixer    megatron's Mamba-2 mixer, its conv1d and SiLU compiled under ``train.compiled_conv1d``
    model    the layer spec (no Transformer Engine), the TransformerConfig, building the model and
             attaching a recipe by global layer number
    distributed  the process group and megatron's parallel state for a run
    schedule the reference's WSD schedule as megatron's OptimizerParamScheduler
    clip_grads  megatron's gradient norm and clipping with one host copy and one multi-tensor product
    engine   a training run's engine: megatron's model, DDP, distributed optimizer, steps, checkpoints
    resume   resume checkpoints through megatron's dist_checkpointing
    shard    the tensor-parallel split and gather of a reference state dict
    parity   the reference model and the megatron model on the same weights and tokens (one GPU)
"""
