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


def draw(p: torch.Tensor, top_p: float, stream: int) -> int:
    """One token from the probabilities `p`, within the nucleus of mass `top_p`."""
    g = torch.Generator().manual_seed(stream)
    if top_p < 1.0:
        p_sorted, idx = p.sort(descending=True)
        # keep the smallest head whose mass reaches top_p (always the top token)
        p_sorted[(p_sorted.cumsum(0) - p_sorted) >= top_p] = 0.0
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
