"""The simulator executor: no model, a predicted duration per scheduled batch from a cost model.

Settings (``configs/executor/sim.yaml``): `SimConfig` below, plus the chosen cost model's own
(`RooflineConfig` for ``roofline``), set flat under ``executor``.

KV swapped to or from host memory (preemption by swap) is charged in the iteration that moves
it, before its forward and not overlapped with it (vLLM v0 copies the swap blocks on the
model's stream before running it): per direction that moves any block,
``pcie_latency_s + blocks x block bytes / (pcie_bandwidth x pcie_eff)``, block bytes per GPU
of the tensor-parallel group (each GPU copies its own share over its own link: an assumption;
in a DGX A100 two GPUs share one PCIe switch's uplink). One transfer per direction, as one
batched copy would be: vLLM v0 issues a copy per block and layer, whose per-copy overheads
make small blocks slower to swap (the vLLM paper, Fig. 19): not modelled, so the swap time
here is a lower bound at small block sizes.

A cost model with a `rewarm` (a CPU profile's decode_rewarm rows: decodes right after a prompt
step run slower) prices a decode-only step by its place after the run's last prompt step
(`costmodels.rewarm.Warmth`, advanced here, once per executed batch); such a run steps every
batch (fast-forward would skip the places) and has one stage.

With ``pipeline_parallel`` P > 1 the executor is one of P virtual engines' (sarathi_lab/topology/pipeline.py
makes them and joins them to one stage clock): a batch is a micro-batch whose CPU side, layers
(split among the stages by their layers), LM head (last stage) and activation transfers are
placed on the pipeline's stages; its duration runs from its scheduling to its leaving the last
stage. KV capacity: what every stage's GPUs hold beside their layers' weights, shared out among
the virtual engines (vLLM v0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import ClassVar

import numpy as np

from sarathi_lab.costmodels.rewarm import prompt_tokens
from sarathi_lab.executors import speculation
from sarathi_lab.executors.base import Executor, ExecutorConfig, StepResult
from sarathi_lab.settings import ConfigError, parse, refuse_renamed, setting, split_node


@dataclass
class SimConfig(ExecutorConfig):
    cost_model: str = setting(
        "roofline", help="a registered cost model (roofline, profiled), a dotted path, or auto: "
        "a measured profile under profile_dirs that matches the run's model, dtype, hardware "
        "and tensor_parallel, else the roofline (one log line at start-up says which; the "
        "summary's cost_model records it)")
    profile_dirs: str | None = setting(
        None, help="cost_model=auto: folders searched for profiles (os.pathsep-separated); "
        "null: $SARATHI_LAB_PROFILES; nothing is downloaded")
    tensor_parallel: int = setting(1, ge=1, le=64, help="GPUs per model replica (per stage)")
    gpu_memory_utilization: float = setting(0.9, gt=0, le=1,
                                            help="share of GPU memory the engine may use")
    workspace_bytes: int = setting(2**30, ge=0, help="memory held back: CUDA context, workspaces")
    activation_tokens: int = setting(8192, ge=0,
                                     help="activations of the largest step, held back from KV")
    pipeline_parallel: int = setting(1, ge=1, le=64, help="pipeline stages per replica, each "
                                     "a tensor_parallel group (GPUs: their product); > 1 runs "
                                     "vLLM v0's virtual engines, one per stage")
    step_jitter: float | None = setting(None, gt=0, le=2, help="each iteration's time times a "
                                        "lognormal factor of median 1 and this log-sd; null: "
                                        "none (fast-forward is off with it)")
    step_jitter_seed: int = setting(0, ge=0, help="the jitter's random stream (with step_jitter)")
    step_jitter_memory: float = setting(0.0, ge=0, lt=1, help="the correlation of a step's log "
                                        "jitter with the step before's (with step_jitter; 0: "
                                        "independent draws)")
    # speculative decoding (scheduler.num_speculative_tokens > 0; executors/speculation.py)
    draft: str | None = setting(None, help="speculation: the draft, layers:N (the target's "
                                "first N layers with its LM head) or a model preset "
                                "(configs/model), priced by the roofline on the same hardware "
                                "and tensor_parallel (the torch executor's setting, same values)")
    draft_cost_ratio: float | None = setting(None, gt=0, help="speculation: a draft step's cost "
                                             "as a share of the target's decode step of the same "
                                             "decodes (instead of draft)")
    acceptance: str = setting("fixed", choices=("fixed", "geometric", "trace"),
                              help="speculation: fixed (acceptance_rate for every draft) | "
                                   "geometric (acceptance_rates, one per draft position) | trace "
                                   "(each request's rate, a CSV trace's acceptance_rate column)")
    acceptance_rate: float | None = setting(None, ge=0, le=1, help="acceptance=fixed: the chance "
                                            "each draft token is accepted")
    acceptance_rates: list[float] | None = setting(
        None, help="acceptance=geometric: p_i, the chance the i-th draft is accepted once the "
                   "ones before it were, one per position")
    acceptance_seed: int = setting(0, ge=0, help="speculation: the acceptance draws' stream")
    # the chosen cost model's typed settings, filled by SimExecutor.parse_config
    cost_model_settings: object = field(default=None, metadata={"internal": True})

    #: old names, refused with the new one
    renamed: ClassVar[dict] = {
        "draft_model": "draft (layers:N, the target's first N layers, or a model preset; as "
                       "the torch executor's)"}


#: the share of a node's host memory its GPUs' swap spaces may take (vLLM's limit)
SWAP_HOST_SHARE = 0.7


class _StepJitter:
    """The factor on each executed step's time, exp(e_t): e an AR(1) process of sd `sigma` and
    lag-1 correlation `rho` (0: independent draws), from its own seeded stream."""
    __slots__ = ("rng", "sigma", "rho", "fresh", "e")

    def __init__(self, sigma: float, rho: float, seed: int):
        self.rng = np.random.default_rng(seed)
        self.sigma, self.rho, self.fresh = sigma, rho, math.sqrt(1 - rho * rho)
        # the first step's log factor drawn from the process's stationary law
        self.e = 0.0 if rho == 0 else sigma * self.rng.standard_normal()

    def next(self) -> float:
        self.e = self.rho * self.e + self.fresh * self.sigma * self.rng.standard_normal()
        return math.exp(self.e)


class SimExecutor(Executor):
    config_class = SimConfig
    simulated = True
    uses_hardware = True
    supports_fast_forward = True   # with pipeline_parallel 1 (the pipeline steps every batch)
    supports_swap = True           # with pipeline_parallel 1
    supports_sliding_window_kv = True   # it reads no KV: only the block counts
    supports_pipeline = True
    supports_speculation = True    # with pipeline_parallel 1 (executors/speculation.py)
    speculation_settings = speculation.SETTINGS
    offers_predictor = True

    @classmethod
    def reads_model_key(cls, key: str) -> bool:
        from sarathi_lab.models.shape import ModelShape
        # the shape, where it came from (hf_name, for the reader; hf_config, the config.json
        # the shape is read from)
        return key in ModelShape.__dataclass_fields__ or key in ("hf_name", "hf_config", "dtype")

    @classmethod
    def parse_config(cls, values: dict, where: str = "executor") -> SimConfig:
        """The sim executor's settings and, from the same node, its cost model's."""
        from sarathi_lab.registry import cost_model_class
        values = dict(values)
        refuse_renamed(values, SimConfig.renamed, where)
        own = {f.name for f in fields(SimConfig) if not f.metadata.get("internal")}
        name = values.get("cost_model", SimConfig.cost_model)
        try:
            # auto reads the roofline's settings (and passes iteration_overhead_s on to a
            # profile it chooses; costmodels.auto refuses the others then)
            cm_cls = cost_model_class("roofline" if name == "auto" else name)
        except ValueError as e:
            raise ConfigError(f"{where}.cost_model: {e}") from None
        theirs = {f.name for f in fields(cm_cls.config_class)}
        # sim.yaml lists the roofline's overrides as null: unset, whichever cost model is chosen
        values = {k: v for k, v in values.items() if v is not None or k in own or k in theirs}
        if name == "auto" and values.get("profile") is not None:
            raise ConfigError(f"{where}.profile={values['profile']} with {where}.cost_model=auto: "
                              f"auto looks for a profile under {where}.profile_dirs; to name "
                              f"one, set {where}.cost_model=profiled")
        mine, cm_values = split_node(values, own, theirs, where, "the sim executor",
                                     f"cost model {name!r}",
                                     [("executor", own), ("cost model", theirs)])
        cfg = parse(SimConfig, mine, where, "the sim executor")
        if cfg.profile_dirs is not None and cfg.cost_model != "auto":
            raise ConfigError(f"{where}.profile_dirs={cfg.profile_dirs}: read only with "
                              f"{where}.cost_model=auto (cost_model={cfg.cost_model!r})")
        for name in ("step_jitter_seed", "step_jitter_memory"):
            if cfg.step_jitter is None and getattr(cfg, name) != getattr(SimConfig, name):
                raise ConfigError(f"{where}.{name}={getattr(cfg, name)}: read only with "
                                  f"{where}.step_jitter set")
        if cfg.step_jitter is not None and cfg.pipeline_parallel > 1:
            raise ConfigError(f"{where}.step_jitter with pipeline_parallel="
                              f"{cfg.pipeline_parallel}: jitter is simulated for one stage only")
        speculation.check_unread(cfg)
        if cfg.draft is not None:
            speculation.draft_layers(cfg.draft)   # its form; N and the preset: check_model
        cfg.cost_model_settings = parse(cm_cls.config_class, cm_values, where,
                                        f"cost model {name!r}")
        return cfg

    def __init__(self, cfg: SimConfig, model: dict, hardware: dict | None):
        from sarathi_lab.registry import cost_model_class
        if not hardware:
            raise ConfigError("the sim executor needs a hardware preset (e.g. hardware=a100-80gb)")
        self.cfg = cfg
        self.chosen_by = None
        if cfg.cost_model == "auto":
            from sarathi_lab.costmodels import auto
            self.cost_model, self.chosen_by = auto.choose(
                model, hardware, cfg.tensor_parallel, cfg.cost_model_settings, cfg.profile_dirs)
        else:
            cm_cls = cost_model_class(cfg.cost_model)
            cm_cfg = cfg.cost_model_settings or cm_cls.config_class()
            self.cost_model = cm_cls(model, hardware, cfg.tensor_parallel, cm_cfg)
        # bound once: execute() runs hundreds of thousands of times per simulation
        self._step_time = self.cost_model.step_time
        draft = None
        if cfg.draft is not None:
            from sarathi_lab.costmodels.roofline import RooflineCostModel
            # the roofline prices any model shape; a measured profile only the model measured
            if type(self.cost_model) is not RooflineCostModel:
                raise ConfigError(f"executor.draft={cfg.draft}: the cost model "
                                  f"({type(self.cost_model).__name__}) prices only the model "
                                  "it was made for; use executor.draft_cost_ratio")
            shape, cm_cfg = draft_shape(cfg, model)
            draft = RooflineCostModel(shape, hardware, cfg.tensor_parallel, cm_cfg)
        self._spec = speculation.Speculation(cfg, self.cost_model, draft)
        # a preset draft is a model of its own beside the target: its weights and its KV come
        # out of the KV budget; layers:N is the target's first layers (no weights or KV of its
        # own: executors/draft.py), as is draft_cost_ratio's draft, which only prices steps
        self._draft_memory = draft if draft is not None \
            and speculation.draft_layers(cfg.draft) is None else None
        from sarathi_lab.costmodels.roofline import HardwareSpec
        hw = HardwareSpec.from_config(hardware)
        self.pcie_latency_s = hw.pcie_latency_s
        self.pcie_bytes_per_s = hw.pcie_bandwidth * hw.pcie_eff
        self._host = (hw.host_memory_bytes, hw.gpus_per_node)   # bounds the swap space
        self._block_bytes = None   # of the bound KV cache's blocks, set by bind
        self.stage_pricing = None if cfg.pipeline_parallel == 1 else \
            self._price_stages(model, hardware)
        self._pipe = None   # the stage clock, once joined (sarathi_lab/topology/pipeline.py)
        # A cost model gives a step's typical (median) time; a real step varies around it (on a
        # shared CPU by +-25% between p10 and p90), and a run's P99 TBT is drawn from that
        # variation's slow tail. One draw per executed batch, in order: a fast-forwarded run
        # would draw for iterations it then does not take, so there is none. On a CPU the
        # variation has memory (a machine's speed drifts over hundreds of steps: lag-1
        # correlation 0.79-0.86 in experiments/fidelity's real runs), which makes slow steps
        # come in runs and lifts a run's P90/P99 more than independent draws of the same spread:
        # step_jitter_memory = rho, the log factor an AR(1) process of sd step_jitter,
        # e_t = rho e_(t-1) + sqrt(1 - rho^2) sigma z_t (rho = 0: the independent draws).
        # Decodes right after a prompt step run slower (a CPU profile's decode_rewarm rows):
        # priced by the run's step order, which a fast-forwarded run would skip through.
        self._warmth = None
        if self.cost_model.rewarm is not None:
            if cfg.pipeline_parallel > 1:
                raise ConfigError(
                    f"executor.pipeline_parallel={cfg.pipeline_parallel}: the cost model's "
                    "profile charges decodes after a prompt step by the step order "
                    "(decode_rewarm rows, a CPU profile's), which is simulated for one stage "
                    "only; use a profile without them or pipeline_parallel=1")
            self._warmth = self.cost_model.rewarm.track()
            self.supports_fast_forward = False
            self.no_fast_forward = ("the profile's decode_rewarm rows price each decode by its "
                                    "place after the last prompt step")
        self._jitter = None
        if cfg.step_jitter is not None:
            self._jitter = _StepJitter(cfg.step_jitter, cfg.step_jitter_memory,
                                       cfg.step_jitter_seed)
            self.supports_fast_forward = False
            self.no_fast_forward = "executor.step_jitter draws a factor for every executed step"

    @classmethod
    def check_model(cls, cfg: SimConfig, model: dict) -> None:
        from sarathi_lab.costmodels.roofline.moe import check_layout
        from sarathi_lab.models.shape import ModelShape
        q = cfg.cost_model_settings
        if hasattr(q, "expert_parallel"):   # the roofline's (auto's too): a MoE layout
            try:
                check_layout(ModelShape.from_config(model), int(q.expert_parallel or 1),
                             q.moe_imbalance)
            except ValueError as e:
                raise ConfigError(f"executor.{e}") from None
        if cfg.draft is not None:
            draft_shape(cfg, model)   # N within the model's layers, the preset exists

    @classmethod
    def check_speculation_settings(cls, cfg: SimConfig, k: int) -> None:
        speculation.check_settings(cfg, k)

    def prepare_trace(self, df, trace_cfg: dict):
        if self.cfg.acceptance == "trace":
            self._spec.read_trace(df)
        return df

    def predictor(self):
        # the cost model's own price (without step_jitter: the controller plans on the median);
        # with spec_len > 0, the draft's steps and the verification as `execute` prices them
        return self._spec.predict

    def cost_model_record(self) -> dict:
        """Which cost model priced the run, and from what (the summary's ``cost_model``)."""
        from sarathi_lab.costmodels.profiled import ProfiledCostModel
        from sarathi_lab.costmodels.roofline import RooflineCostModel
        name = self.cfg.cost_model
        if name == "auto":
            name = "profiled" if isinstance(self.cost_model, ProfiledCostModel) else "roofline"
        rec = {"name": name, **self.cost_model.describe()}
        if isinstance(self.cost_model, RooflineCostModel):
            rec["hardware"] = self.cost_model.hw.name
        if self.chosen_by:
            rec["chosen_by"] = self.chosen_by
        return rec

    def bind(self, kv) -> None:
        super().bind(kv)
        self._block_bytes = self.kv_block_bytes(kv.block_size)

    def swap_time(self, num_blocks: int) -> float:
        """Seconds to copy `num_blocks` KV blocks one way between a GPU and host memory."""
        if not num_blocks:
            return 0.0
        return self.pcie_latency_s + num_blocks * self._block_bytes / self.pcie_bytes_per_s

    def kv_block_bytes(self, block_size: int) -> int | None:
        return self.cost_model.kv_block_bytes(block_size)

    def check_swap_memory(self, num_host_blocks: int, block_size: int) -> None:
        if self.cfg.pipeline_parallel > 1:
            raise ConfigError(f"scheduler.preemption_mode=swap with executor.pipeline_parallel="
                              f"{self.cfg.pipeline_parallel}: swapping is simulated for one "
                              "stage only; use preemption_mode=recompute with pipeline stages")
        if self.kv_block_bytes(block_size) is None:
            raise ConfigError(f"scheduler.preemption_mode=swap: cost model "
                              f"{self.cfg.cost_model!r} does not give the bytes of a KV block "
                              "(kv_block_bytes), so the swap traffic cannot be priced")
        # vLLM's rule (_verify_cpu_swap_space): every GPU of the node holds its swap space in
        # the node's host memory, which they may fill to 70% at most ("Too large swap space")
        host, gpus = self._host
        per_gpu = num_host_blocks * self.kv_block_bytes(block_size)
        if per_gpu * gpus > SWAP_HOST_SHARE * host:
            gib = 2**30
            raise ConfigError(
                f"scheduler.swap_space_gib: a swap space of {per_gpu / gib:,.6g} GiB per GPU "
                f"({num_host_blocks:,} KV blocks), on each of hardware.gpus_per_node={gpus} "
                f"GPUs, takes {per_gpu * gpus / gib:,.4g} GiB of the node's host memory "
                f"(hardware.host_memory_bytes={host:.4g}, {host / gib:,.4g} GiB), more than the "
                f"{SWAP_HOST_SHARE:.0%} vLLM allows; lower scheduler.swap_space_gib (or "
                "scheduler.num_swap_blocks) to at most "
                f"{math.floor(SWAP_HOST_SHARE * host / gpus / gib * 100) / 100:,.2f} GiB per GPU")

    def _price_stages(self, model, hardware) -> dict:
        """What pricing a micro-batch on the stages takes: each stage's share of the layers,
        and per stage boundary the transfer's (latency, seconds per token)."""
        from sarathi_lab.costmodels.base import split_step
        from sarathi_lab.costmodels.roofline import RooflineCostModel, stage_layers
        cm, tp, P = self.cost_model, self.cfg.tensor_parallel, self.cfg.pipeline_parallel
        # memory and links are byte counts of the model's shape over the hardware's links:
        # the roofline's, whatever the cost model (as the profiled one sizes memory)
        self._layout = layout = cm if isinstance(cm, RooflineCostModel) else \
            RooflineCostModel(model, hardware, tp)
        L = layout.model.num_layers
        try:
            self.layers_per_stage = layers = stage_layers(L, P)
        except ValueError as e:
            raise ConfigError(f"executor.{e}") from None
        gpn = layout.hw.gpus_per_node
        g = tp * layout.ep          # a stage's GPUs: its expert-parallel groups of tp
        if gpn % g:
            raise ConfigError(
                f"executor.tensor_parallel={tp} (x expert_parallel={layout.ep}) with "
                f"pipeline_parallel={P}: a stage's GPUs must share a node of "
                f"hardware.gpus_per_node={gpn} (their product must divide it)")
        # stage s holds GPUs [s g, (s+1) g): the boundary after it leaves the node when
        # (s+1) g is a multiple of the node's GPUs
        links = [layout.send_recv_terms(across_nodes=(s + 1) * g % gpn == 0)
                 for s in range(P - 1)]
        return {"share": [n / L for n in layers], "links": links,
                "gather": layout.gather_terms(), "parts": split_step(cm)}

    def join_pipeline(self, pipeline, engine_index: int, clock) -> None:
        """Called once by the pipeline driver: its stage clock (`place`), this virtual engine's
        index, and `clock()`, the virtual engine's time (when its next batch is scheduled)."""
        assert self.stage_pricing is not None, "join_pipeline with pipeline_parallel=1"
        self._pipe, self._engine_index, self._clock = pipeline, engine_index, clock

    def execute(self, out) -> StepResult:
        if self.stage_pricing is not None:
            return self._execute_stages(out)
        accepted = None
        if out.spec_lens:
            t, accepted = self._spec.step(out)
        else:
            t = self._step_time(out.reqs, out.num_new_tokens)
        if self._warmth is not None:
            t *= self._warmth.step(prompt_tokens(out.reqs, out.num_new_tokens))
        if self._jitter is not None:
            t *= self._jitter.next()
        if out.swapped_out or out.swapped_in:
            s = self.swap_time(sum(len(p) for _, p in out.swapped_out)) \
                + self.swap_time(sum(len(p) for _, p in out.swapped_in))
            return StepResult(t + s, swap_s=s, accepted=accepted)
        return StepResult(t, accepted=accepted)

    def _execute_stages(self, out) -> StepResult:
        """A micro-batch through the stages: its duration runs from now (its scheduling) to
        its leaving the last stage."""
        if self._pipe is None:
            raise RuntimeError(f"executor.pipeline_parallel={self.cfg.pipeline_parallel}: the "
                               "executor runs inside a pipeline (sarathi_lab.topology.pipeline."
                               "PipelineReplica), not on an engine of its own")
        st = self.stage_pricing
        cpu, layers, head = st["parts"](out.reqs, out.num_new_tokens)
        T = out.total_tokens
        compute = [layers * f for f in st["share"]]
        compute[-1] += head
        g_lat, g_tok = st["gather"]
        if g_tok:   # the receiving stages all-gather their TP slices
            for s in range(1, len(compute)):
                compute[s] += g_lat + T * g_tok
        send = [lat + T * per_token for lat, per_token in st["links"]]
        now = self._clock()
        end = self._pipe.place(self._engine_index, now, cpu, compute, send)
        return StepResult(end - now)

    def decode_run(self, contexts: np.ndarray, k: int) -> np.ndarray:
        return self.cost_model.decode_run(contexts, k)

    def chunk_run(self, contexts, computed, chunks, samples_last):
        return self.cost_model.chunk_run(contexts, computed, chunks, samples_last)

    def num_kv_blocks(self, block_size: int) -> int:
        """The KV blocks of this executor's policy: with pipeline stages, its virtual engine's
        share (1 / pipeline_parallel, as vLLM v0 divides them) of what every stage holds."""
        c = self.cfg
        if self.stage_pricing is None:
            if self._draft_memory is not None:   # (speculation needs pipeline_parallel 1)
                try:
                    return self.cost_model.num_kv_blocks(
                        block_size, c.gpu_memory_utilization, c.workspace_bytes,
                        c.activation_tokens, draft=self._draft_memory)
                except ValueError as e:
                    raise ConfigError(str(e)) from None
            return self.cost_model.num_kv_blocks(block_size, c.gpu_memory_utilization,
                                                 c.workspace_bytes, c.activation_tokens)
        return self._layout.pipeline_kv_blocks(
            self.layers_per_stage, block_size, c.gpu_memory_utilization, c.workspace_bytes,
            c.activation_tokens) // c.pipeline_parallel

    def check_kv_memory(self, num_blocks: int, block_size: int) -> None:
        fit = self.num_kv_blocks(block_size)
        if num_blocks > fit:
            raise ConfigError(
                f"scheduler.num_kv_blocks={num_blocks}: more than the {fit} blocks of "
                f"{block_size} tokens that fit the simulated GPU's memory beside the weights "
                + (f"(per virtual engine: {self.cfg.pipeline_parallel} share the stages' "
                   "blocks) " if self.stage_pricing is not None else "")
                + "(see executor.gpu_memory_utilization, or the hardware preset)")

    def max_model_len(self) -> int:
        return self.cost_model.max_model_len


def draft_shape(cfg: SimConfig, model: dict):
    """(the draft's ModelShape, the roofline settings that price it) of `executor.draft`:
    layers:N, the target's shape cut to its first N layers (embedding, final norm and LM head
    kept: the torch executor's LayerDraft); a preset, that model. A dense draft of an
    expert-parallel target runs on each GPU group as it is: no expert parallelism to price."""
    from sarathi_lab.models.shape import ModelShape
    target = ModelShape.from_config(model)
    n = speculation.draft_layers(cfg.draft)
    if n is None:
        shape = ModelShape.from_config(model_preset(cfg.draft, "executor.draft"))
    elif n > target.num_layers:
        raise ConfigError(f"executor.draft={cfg.draft}: model {target.name!r} has "
                          f"{target.num_layers} layers; the draft takes its first N, "
                          f"1 <= N <= {target.num_layers}")
    else:
        try:
            shape = replace(target, name=f"{target.name} (first {n} layers)", num_layers=n)
        except ValueError as e:
            raise ConfigError(f"executor.draft={cfg.draft}: {e}") from None
    cm_cfg = cfg.cost_model_settings
    if cm_cfg is not None and not shape.is_moe and getattr(cm_cfg, "expert_parallel", None):
        cm_cfg = replace(cm_cfg, expert_parallel=None, moe_imbalance=None)
    return shape, cm_cfg


def model_preset(name: str, key: str = "executor.draft") -> dict:
    """A shipped model preset (configs/model/<name>.yaml) as a dict: a draft model by name
    (`key`: the setting that names it, for the error)."""
    from importlib.resources import files

    import yaml
    root = files("sarathi_lab.configs").joinpath("model")
    path = root.joinpath(f"{name}.yaml")
    if not path.is_file():
        names = sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))
        raise ConfigError(f"{key}={name}: no such model preset; the presets: "
                          f"{', '.join(names)}")
    return yaml.safe_load(path.read_text())
