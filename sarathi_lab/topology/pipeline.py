"""Pipeline parallelism: one replica's stages on one clock, served by vLLM v0's virtual engines.

``executor.pipeline_parallel=P`` splits the model's layers into P stages (vLLM's partition,
`costmodels.roofline.stage_layers`), each on its own tensor-parallel group. As vLLM v0 does,
the replica runs P *virtual engines*: each is a whole `Engine` (its own policy and its own 1/P
of the KV blocks), a request goes on arrival to the one with the fewest unfinished requests
(the lowest index among equals) and stays there, and each keeps one micro-batch in flight: it
schedules its next batch when its last one has left the last stage. The P engines run on one
virtual clock through their public API (`fleet.Fleet` on the driver's clock, with vLLM's
assignment as its router), and their executors share one stage clock, `Pipeline`, on which
every micro-batch is placed, in the order it was scheduled (the driver always steps the engine
furthest behind):

    host:      the CPU side of the iteration (scheduling, input preparation, sampling, output
               processing: the cost model's per-iteration and per-request overheads), once per
               micro-batch, on the engine's host: one at a time (vLLM v0 runs every virtual
               engine in one process), occupying no GPU stage
    stage s:   its layers' time (the cost model's time for the batch's L layers x l_s / L; the
               last stage adds the LM head; a receiving stage adds the all-gather of its TP
               slices), once the stage is free
    s -> s+1:  the activations' send/recv (`RooflineCostModel.send_recv_terms`), which occupies
               both stages: it starts when stage s has finished the micro-batch's layers and
               stage s+1 is free (an NCCL send completes only as its receive runs), so a stage
               may hold a finished micro-batch, blocked, while the next one is busy

A micro-batch's duration (its iteration record) runs from its scheduling to its leaving the last
stage; its tokens come out then. Fast-forward is off: every micro-batch is placed.

A stage's **bubble** is the time it is idle, or blocked holding a finished micro-batch, while a
micro-batch that has not yet reached it is on its way (being scheduled, on an earlier stage, or
being sent): for micro-batch m on stage s, max(0, start_s(m) - max(release_s(m-1), ready(m)))
plus its blocked time there. Idle time with nothing on its way (no load, or every micro-batch
past the stage) is not a bubble. Uniform micro-batches on stages of equal time keep every stage
busy once the pipeline is full: no bubble (tested).
"""
from __future__ import annotations

import numpy as np

from sarathi_lab.engine import ITER_COLUMNS, Engine
from sarathi_lab.metrics import iterations_table, summarize
from sarathi_lab.topology.fleet import Fleet
from sarathi_lab.topology.results import (
    one_kv_size,
    pooled_prefix,
    replica_column,
    replica_gpus,
    requests_frame,
)
from sarathi_lab.topology.routers import Router, RouterConfig

#: columns the iterations table gains under pipeline parallelism (besides bubble_stage<s>)
PIPELINE_COLUMNS = ("virtual_engine", "pipeline_enter", "bubble")


class FewestUnfinished(Router):
    """vLLM v0's choice of virtual engine for a new request: the one with the fewest unfinished
    requests (waiting or running, counted exactly at the arrival), the lowest index among
    equals."""
    name = "fewest_unfinished"

    def route(self, req, replicas, now):
        return min(range(len(replicas)), key=lambda j: replicas[j].num_outstanding)


class Pipeline:
    """The stage clock of one pipeline-parallel replica: when the host and each stage are free
    next, and what each micro-batch waited. Micro-batches are placed in the order they were
    scheduled, and keep that order on every stage (each stage serves them first come, first
    served)."""

    def __init__(self, num_stages: int):
        if num_stages < 2:
            raise ValueError(f"a pipeline has at least 2 stages, not {num_stages}")
        self.num_stages = num_stages
        self.host_free = 0.0
        self.free = [0.0] * num_stages     # when each stage let go of its last micro-batch
        self.busy = [0.0] * num_stages     # seconds computing, sending or receiving
        self.bubble = [0.0] * num_stages   # seconds of bubble (module docstring)
        self._last_ready = 0.0
        # per micro-batch: (virtual engine, when stage 0 took it, its bubble on each stage)
        self.records: list[tuple[int, float, tuple[float, ...]]] = []

    def place(self, engine: int, ready: float, cpu: float, compute, send) -> float:
        """Place a micro-batch scheduled at `ready` by virtual engine `engine`: `cpu` seconds
        on the host, `compute[s]` on stage s, `send[s]` from stage s to s + 1. Returns when it
        leaves the last stage."""
        P = self.num_stages
        assert len(compute) == P and len(send) == P - 1, (compute, send)
        assert ready >= self._last_ready, "micro-batches are placed in the order scheduled"
        self._last_ready = ready
        free, busy, bubble = self.free, self.busy, self.bubble
        host = max(ready, self.host_free) + cpu
        self.host_free = host
        enter = taken = start = max(host, free[0])   # stage s holds it from `taken` on and
        waited = []                                  # computes from `start` on
        for s in range(P):
            gap = taken - max(free[s], ready)   # free[s]: still the previous micro-batch's release
            b = gap if gap > 0.0 else 0.0
            done = start + compute[s]
            busy[s] += compute[s]
            if s + 1 < P:
                taken = max(done, free[s + 1])  # the transfer waits for the next stage
                b += taken - done               # blocked, holding the finished micro-batch
                start = taken + send[s]
                busy[s] += send[s]
                busy[s + 1] += send[s]
                free[s] = start
            else:
                free[s] = done
            bubble[s] += b
            waited.append(b)
        self.records.append((engine, enter, tuple(waited)))
        return done

    def summary(self) -> dict:
        """Per stage and in all: busy and bubble seconds, and the bubble's share of the time
        the stage worked or waited for work on its way (0 for a stage that did neither)."""
        frac = [b / (b + w) if b + w > 0 else 0.0 for b, w in zip(self.bubble, self.busy)]
        total_b, total_w = sum(self.bubble), sum(self.busy)
        return {"stages": self.num_stages, "micro_batches": len(self.records),
                "busy_s": list(self.busy), "bubble_s": list(self.bubble),
                "bubble_fraction": frac, "bubble_total_s": total_b,
                "bubble_fraction_total": total_b / (total_b + total_w)
                if total_b + total_w > 0 else 0.0}


class PipelineReplica(Fleet):
    """One pipeline-parallel replica: `engines` are its virtual engines (one per stage, their
    executors built with the same ``pipeline_parallel``), joined to one `Pipeline` and driven
    as a fleet on the driver's clock. `progress` as `Engine`'s."""

    replica_col = "virtual_engine"

    def __init__(self, engines: list[Engine], progress=None):
        P = len(engines)
        for e in engines:
            if getattr(e.executor, "supports_pipeline", False) is not True:
                raise ValueError(f"executor {type(e.executor).__name__} does not run pipeline "
                                 "stages")
            if e.fast_forward:
                raise ValueError("a virtual engine steps every micro-batch: build its Engine "
                                 "with fast_forward=False")
            if e.executor.cfg.pipeline_parallel != P:
                raise ValueError(f"{P} virtual engines for executor.pipeline_parallel="
                                 f"{e.executor.cfg.pipeline_parallel}: one per stage")
        self.pipeline = Pipeline(P)
        for j, e in enumerate(engines):
            e.executor.join_pipeline(self.pipeline, j, lambda e=e: e.now)
        super().__init__(engines, FewestUnfinished(RouterConfig(), P), progress=progress)

    def named_engines(self) -> list[tuple]:
        return [(f"virtual engine {j}", e) for j, e in enumerate(self.engines)]

    def describe(self) -> str:
        return f"a pipeline replica of {len(self.engines)} virtual engines"

    def tables(self, requests):
        """(requests table with `virtual_engine`, iterations table in the order the
        micro-batches were scheduled, with PIPELINE_COLUMNS and `bubble_stage<s>`)."""
        req_df = requests_frame(requests, self.engines)
        req_df[self.replica_col] = replica_column(requests, self.replica_of)
        recs = self.pipeline.records
        P = self.pipeline.num_stages
        owner = np.fromiter((r[0] for r in recs), np.int64, len(recs))
        rows = np.empty((len(recs), len(ITER_COLUMNS)))
        for j, e in enumerate(self.engines):
            mine = owner == j
            its = e.iterations()
            assert len(its) == int(mine.sum()), "one placed micro-batch per iteration"
            rows[mine] = its
        it_df = iterations_table(rows)
        it_df["virtual_engine"] = owner
        it_df["pipeline_enter"] = np.fromiter((r[1] for r in recs), float, len(recs))
        waited = np.array([r[2] for r in recs], float).reshape(len(recs), P)
        it_df["bubble"] = waited.sum(axis=1)
        for s in range(P):
            it_df[f"bubble_stage{s}"] = waited[:, s]
        return req_df, it_df

    def summarize(self, req_df, it_df, slo: dict | None = None,
                  price_per_gpu_hour: float | None = None,
                  num_gpus: int | None = None) -> dict:
        """The replica's summary: every request and micro-batch (`kv.blocks_total`: all the
        virtual engines' blocks; utilisation per iteration against its engine's share), with
        `pipeline` (Pipeline.summary, each stage's layers, the requests of each virtual
        engine; `num_gpus`: the replica's, by default its executors')."""
        if num_gpus is None:
            num_gpus = replica_gpus(self.engines[0])
        kvs = [e.kv for e in self.engines]
        blocks, block_size = one_kv_size(kvs)
        out = summarize(req_df, it_df, slo=slo, kv_blocks_total=blocks, block_size=block_size,
                        prefix_cache=pooled_prefix(kvs), price_per_gpu_hour=price_per_gpu_hour,
                        num_gpus=num_gpus)
        out["kv"]["blocks_total"] = blocks * len(kvs)
        ve = req_df["virtual_engine"].to_numpy()
        out["pipeline"] = {
            **self.pipeline.summary(),
            "layers": list(self.engines[0].executor.layers_per_stage),
            "virtual_engines": len(self.engines),
            "requests_per_engine": [int((ve == j).sum()) for j in range(len(self.engines))],
        }
        return out
