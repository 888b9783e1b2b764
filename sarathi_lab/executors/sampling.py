"""What the torch executor samples from and stops at: seeded per-token streams, nucleus draws,
and the EOS ids a checkpoint declares."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch


def stream_seed(seed: int, request_id, index: int) -> int:
    """The seed of one token's draw: from (seed, request id, output index) alone, so a request's
    tokens do not depend on what it was batched with."""
    key = f"{seed}/{request_id!r}/{index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


# below this temperature logits / t may overflow float32 (|logit| > 3.4e35) and t itself
# rounds to 0 in float32 under 1.4e-45 (0 / 0: NaN); tiny temperatures take the exact path
_FLOAT32_SAFE_T = 1e-3


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) over the last axis, on the CPU, for any temperature > 0.
    Above `_FLOAT32_SAFE_T` as it always was (the same bits, so runs keep their tokens); below
    it shifted by the row's maximum and divided in float64, where every positive temperature
    is a number: the top logit gives exp(0) = 1 and the others exp(-huge) = 0, so a
    temperature of 1e-300 is greedy decoding (ties shared), never NaN."""
    if temperature >= _FLOAT32_SAFE_T:
        return torch.softmax(logits / temperature, dim=-1).cpu()
    shifted = (logits - logits.max(dim=-1, keepdim=True).values).double()
    return torch.softmax(shifted / temperature, dim=-1).cpu()


def draw(p: torch.Tensor, top_p: float, stream: int) -> int:
    """One token from the probabilities `p`, within the nucleus of mass `top_p`."""
    g = torch.Generator().manual_seed(stream)
    if top_p < 1.0:
        p_sorted, idx = p.sort(descending=True)
        # keep the smallest head whose mass reaches top_p, and always the top token: a top_p
        # under float32's smallest number compares as 0 and would drop it too
        cut = (p_sorted.cumsum(0) - p_sorted) >= top_p
        cut[0] = False
        p_sorted[cut] = 0.0
        return int(idx[torch.multinomial(p_sorted, 1, generator=g)])
    return int(torch.multinomial(p, 1, generator=g))


def eos_token_ids(model_cfg: dict) -> tuple[int, ...]:
    """The EOS ids of ``model.path``'s checkpoint, as `generate` reads them: generation_config.json,
    else config.json (an int or a list). None for a preset with random weights."""
    if not model_cfg.get("path"):
        return ()
    d = Path(str(model_cfg["path"])).expanduser()
    for name in ("generation_config.json", "config.json"):
        f = d / name
        if not f.is_file():
            continue
        try:
            eos = json.loads(f.read_text()).get("eos_token_id")
        except (ValueError, AttributeError) as e:
            raise ValueError(f"{f}: not a JSON object ({e})") from None
        if eos is None:
            continue
        ids = eos if isinstance(eos, list) else [eos]
        if not ids or not all(type(i) is int and i >= 0 for i in ids):
            raise ValueError(f"{f}: eos_token_id={eos!r} is not a token id or a list of them")
        return tuple(ids)
    return ()
