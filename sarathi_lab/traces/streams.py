"""Seeded random streams: one per knob (arrivals, prompt lengths, output lengths, token ids,
shuffle), so that changing one, say the length distribution, leaves the others' draws unchanged.
"""
from __future__ import annotations

import numpy as np

# Independent random streams, so one knob does not reshuffle the others.
ARRIVAL_STREAM, PROMPT_STREAM, OUTPUT_STREAM, IDS_STREAM, SHUFFLE_STREAM = range(5)
# multi-turn sessions: turns per session (sessions.py); Mooncake block hash ids -> token ids,
# one stream per hash id (mooncake.py)
TURNS_STREAM, HASH_BLOCK_STREAM = 5, 6


def stream_rng(seed, stream) -> np.random.Generator:
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([int(stream), int(seed)])
