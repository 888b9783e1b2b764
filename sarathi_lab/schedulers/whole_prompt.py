"""What the policies that never chunk a prompt (request_level, orca, vllm) share: their settings
and the cap on a batch's tokens."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.schedulers.base import Policy, SchedulerConfig
from sarathi_lab.settings import setting


@dataclass
class WholePromptConfig(SchedulerConfig):
    max_num_batched_tokens: int | None = setting(
        None, ge=1, help="cap on a batch's prompt tokens; null: max(max_model_len, 2048)")


def batch_token_cap(cfg: WholePromptConfig, max_model_len: int) -> int:
    """The cap in force; it must admit the longest prompt, or that prompt would wait forever."""
    # a policy built in code from the shared SchedulerConfig gets the default cap
    cap = getattr(cfg, "max_num_batched_tokens", None) or max(max_model_len, 2048)
    if cap < max_model_len:
        raise ValueError(
            f"scheduler.max_num_batched_tokens={cap} is smaller than max_model_len="
            f"{max_model_len}: the policy schedules whole prompts, so a long prompt could never "
            "run (raise it or lower scheduler.max_model_len)")
    return cap


class WholePromptPolicy(Policy):
    config_class = WholePromptConfig
    whole_prompts = True

    def __init__(self, cfg, kv, queue=None):
        super().__init__(cfg, kv, queue)
        self.token_cap = batch_token_cap(cfg, self.max_model_len)

    def token_limit(self) -> int:
        return self.token_cap
