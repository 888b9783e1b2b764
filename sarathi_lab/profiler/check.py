"""The held-out check: whole iterations of mixed batches, predicted by the profiled cost model from
the other rows, against what was measured."""
from __future__ import annotations


def check(profile_path, model: dict, hardware: dict) -> list[dict]:
    """The profiled cost model's predictions of the profile's held-out iterations: rows of
    (chunk, context, batch, decode_context, measured_s, predicted_s, error)."""
    import pyarrow.parquet as pq

    from sarathi_lab.costmodels.profiled import ProfiledConfig, ProfiledCostModel
    cm = ProfiledCostModel(model, hardware, 1, ProfiledConfig(profile=str(profile_path)))
    out = []
    for r in pq.read_table(profile_path).to_pylist():
        if r["operator"] != "iteration":
            continue
        c, k, b, kd = (int(r[x]) for x in ("chunk", "context", "batch", "decode_context"))
        pred = cm.iteration_time([(c, k)], [kd] * b, b + 1)
        out.append({"chunk": c, "context": k, "batch": b, "decode_context": kd,
                    "measured_s": r["time_s"], "predicted_s": pred,
                    "error": pred / r["time_s"] - 1})
    return out
