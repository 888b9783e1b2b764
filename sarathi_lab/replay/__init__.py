"""`sarathi-lab-replay`: a trace replayed against any OpenAI-compatible endpoint (vLLM, SGLang,
TGI, `sarathi-lab-serve`), measured per request as the simulator measures it, written as a run
directory that `sarathi-lab-report` reads beside simulated ones (sarathi_lab/docs/replay.md).

Modules, each importing only those above it in this list:

    command    the command: options, the trace and SLO composed from Hydra overrides
    results    the measured requests as the run-directory contract (requests table, summary)
    loads      open loop at the trace's times, closed loop with N users; progress
    stream     one request: a streamed POST to /v1/completions, every chunk's arrival timed
    prompts    the token-id prompts and request bodies

aiohttp (the `serve` extra) is imported only when a replay starts.
"""
from sarathi_lab.replay.command import main

__all__ = ["main"]
