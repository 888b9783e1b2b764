"""The roofline cost model (the default): FLOPs and bytes of each operator against a GPU preset's
peaks at efficiencies fitted to measured profiles (experiments/calibration/calibrate_roofline.py).

  model.py          RooflineCostModel: an iteration's time, term by term (its docstring: the formula)
  hardware.py       HardwareSpec (the preset) and RooflineConfig (overrides, quantization)
  attention.py      the query-key pairs of a prefill chunk, context and own, under a window
  communication.py  the tensor-parallel all-reduce, pipeline send/recv and all-gather
  memory.py         weights, activations and the KV capacity they leave, per pipeline stage
"""
from sarathi_lab.costmodels.roofline.attention import chunk_pairs, window_pairs
from sarathi_lab.costmodels.roofline.hardware import HardwareSpec, RooflineConfig, gemm_peak
from sarathi_lab.costmodels.roofline.memory import stage_layers
from sarathi_lab.costmodels.roofline.model import RooflineCostModel

__all__ = ["HardwareSpec", "RooflineConfig", "RooflineCostModel", "chunk_pairs", "gemm_peak",
           "stage_layers", "window_pairs"]
