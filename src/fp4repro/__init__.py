"""fp4repro: reproduce and benchmark FP4 pretraining with UE5M3 block scales."""

__version__ = "0.1.0"
