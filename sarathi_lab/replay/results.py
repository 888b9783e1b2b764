"""The measured requests as the run-directory contract of a simulated run (sarathi_lab/run/rundir.py):
`requests.parquet` with the simulator's columns (filled by the same `metrics.requests_table`), an
empty `iterations.parquet` (a client sees no server iterations) and `summary.json` by the same
`metrics.summarize`, with `executor: remote`, the endpoint and the model.

What a client cannot observe is left out rather than made up: `first_scheduled_time` and
`scheduling_delay` are NaN, the summary has no `num_iterations`, `stalls`, `batch` or `queue`
(all read from server iterations), and `num_gpus` and `slo.goodput_rps_per_gpu` are null. What only a client sees is added: the requests table's
`http_status`, `error`, `num_token_chunks` and `server_prompt_tokens` columns, statuses `error` and `timeout` beside
`finished` and `rejected` (HTTP 429), and the summary's `remote` section."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab.metrics import iterations_table, rejection_kind, requests_table, summarize
from sarathi_lab.replay.stream import Outcome
from sarathi_lab.request import Status
from sarathi_lab.run import rundir

# server-iteration figures summarize would compute from an empty iterations table
NOT_OBSERVED = ("num_iterations", "stalls", "batch", "queue")


def fill(requests, outcomes: list[Outcome]) -> None:
    """Record each outcome on its Request, as the engine records a served one."""
    for r, o in zip(requests, outcomes):
        r.token_times = list(o.token_times)
        r.num_output_tokens = o.num_output_tokens
        r.finish_reason = o.finish_reason
        if o.status == "finished":
            r.status, r.finish_time = Status.FINISHED, o.finish_time
        elif o.status == "rejected":
            r.status, r.rejection_reason = Status.REJECTED, o.error


def requests_frame(requests, outcomes: list[Outcome], users: list[int] | None) -> pd.DataFrame:
    """The requests table: the simulator's columns, the client's beside them."""
    fill(requests, outcomes)
    df = requests_table(requests, {r.request_id: r.max_tokens for r in requests})
    if users is not None:
        df.insert(1, "client", np.asarray(users, np.int64))
    # the statuses Request has no member for
    df["status"] = [o.status if o.status in ("error", "timeout") else s
                    for o, s in zip(outcomes, df["status"])]
    df["http_status"] = pd.array([o.http_status for o in outcomes], "Int64")
    df["error"] = [o.error for o in outcomes]
    df["num_token_chunks"] = np.array([o.num_chunks for o in outcomes], np.int64)
    # the prompt as the server counted it (usage.prompt_tokens): a text prompt's length there
    df["server_prompt_tokens"] = pd.array([o.prompt_tokens for o in outcomes], "Int64")
    # the replay sends prompts as ids but reads text back: there are no output ids
    return df.drop(columns=["output_token_ids"], errors="ignore")


def remote_section(df: pd.DataFrame, ignore_eos: bool) -> dict:
    """summary.json's `remote`: failures by status, HTTP status and kind; whether the server
    gave the asked number of tokens (`max_tokens`, with `ignore_eos` if sent) to the requests
    that finished."""
    fin = df[df["status"] == "finished"]
    short = fin[fin["num_output_tokens"] < fin["target_output_tokens"]]
    long = fin[fin["num_output_tokens"] > fin["target_output_tokens"]]
    failed = df[df["status"].isin(["error", "timeout"])]
    codes = Counter(int(c) for c in df["http_status"].dropna())
    return {
        "num_errors": int((df["status"] == "error").sum()),
        "num_timeouts": int((df["status"] == "timeout").sum()),
        "http_status": {str(k): v for k, v in sorted(codes.items())},
        "failures": dict(Counter(rejection_kind(e) for e in failed["error"])),
        "num_short": int(len(short)), "num_long": int(len(long)),
        # ignore_eos sent, and every finished request got what it asked for: honoured
        "output_length_enforced": None if fin.empty else bool(short.empty and long.empty),
        "ignore_eos_sent": ignore_eos,
        "token_chunks_differ": int((fin["num_token_chunks"] != fin["num_output_tokens"]).sum()),
    }


def write(run_dir: Path, df: pd.DataFrame, *, slo: dict | None, extra: dict) -> dict:
    """requests.parquet, iterations.parquet (empty) and summary.json (last) in `run_dir`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    it_df = iterations_table([])
    summary = summarize(df, it_df, slo=slo)
    for key in NOT_OBSERVED:
        summary.pop(key, None)
    summary["num_gpus"] = None   # the endpoint's GPUs are not known here
    if "slo" in summary:
        summary["slo"]["goodput_rps_per_gpu"] = None
        _judge_observed(summary["slo"])
    summary.update(extra)
    rundir.write_parquet(run_dir / rundir.REQUESTS, df)
    rundir.write_parquet(run_dir / rundir.ITERATIONS, it_df)
    rundir.write_json(run_dir / rundir.SUMMARY, summary)
    return summary


def _judge_observed(slo: dict) -> None:
    """Sarathi-Serve's TBT criterion on what a client sees: its median scheduling delay (when
    the server first scheduled a request) is not observable, so that part is marked (met:
    null) and the verdict `meets_tbt_slo` rests on the P99 TBT and the rejections."""
    tbt = []
    for c in slo["criteria"]:
        if c["name"] == "median_scheduling_delay":
            c["met"] = None
            c["not_observed"] = True
        elif c["criterion"] == "tbt":
            tbt.append(c["met"])
    if tbt:
        slo["meets_tbt_slo"] = all(tbt)
