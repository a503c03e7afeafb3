"""The torch reference of the numerics contract: block geometry, the RHT and two-level block
quantization, in plain torch on any device. The Triton kernels must equal it bit for bit."""
