"""Element types as configs spell them, one table for both models: the bytes per element (the
cost model) and the torch dtype (the real model). torch is imported only by `torch_dtype`, so the
simulator, which needs only the bytes, never loads it."""
from __future__ import annotations

# canonical name: (bytes per element, torch attribute, aliases). float8 and int8 have no torch
# entry: the real model's matmuls and kernels do not run in them, but the cost model can price
# them (quantized weights and KV: costmodels/roofline.py).
_TABLE = {
    "float32": (4, "float32", ("fp32", "float")),
    "float16": (2, "float16", ("fp16", "half")),
    "bfloat16": (2, "bfloat16", ("bf16",)),
    "float8": (1, None, ("fp8", "float8_e4m3", "e4m3")),
    "int8": (1, None, ()),
}
_CANONICAL = {alias: name for name, (_, _, aliases) in _TABLE.items()
              for alias in (name, *aliases)}


def dtype_name(dtype, setting: str = "dtype") -> str:
    """The canonical name of `dtype`: a name or alias ("bf16"), "torch.bfloat16", a torch.dtype.
    `setting` names where the value came from, for the error."""
    key = str(dtype).removeprefix("torch.").lower()
    if key not in _CANONICAL:
        raise ValueError(f"{setting}={dtype!r}: unknown dtype; expected one of "
                         f"{', '.join(_CANONICAL)}")
    return _CANONICAL[key]


def dtype_bytes(dtype, setting: str = "dtype") -> int:
    return _TABLE[dtype_name(dtype, setting)][0]


def torch_dtype(dtype, setting: str = "dtype"):
    """The torch.dtype of `dtype`, for the real model."""
    name = dtype_name(dtype, setting)
    attr = _TABLE[name][1]
    if attr is None:
        runs = ", ".join(n for n, (_, a, _) in _TABLE.items() if a)
        raise ValueError(f"{setting}={dtype!r}: the torch executor does not run {name} "
                         f"(it runs {runs})")
    import torch
    return getattr(torch, attr)
