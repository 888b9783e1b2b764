"""The torch executor's speculative step: draft proposals, then greedy verification.

A speculative entry of a batch is a decode scheduled with k > 0 (`SchedulerOutput.spec_lens`),
1 + k tokens: its last emitted token (at position s = its computed tokens) and k draft tokens.

1. `propose`: k greedy forwards of the draft (`executors/draft.py`) over the batch's speculative
   entries only, one token each: forward j feeds each entry with k >= j its last token (j = 1)
   or its draft j - 1, at position s + j - 1, and takes the argmax as draft j.
2. The target runs the whole batch once (prefill chunks, ordinary decodes and each speculative
   entry's 1 + k tokens as one chunk), reading the logits of every row of a speculative entry.
3. `verify`: row j's argmax is the target's greedy token after the entry's first j + 1 inputs;
   the drafts are accepted up to the first one that differs from it, and the target's token at
   that row (the correction, or after k accepted drafts the bonus token) is the entry's sampled
   token. So the tokens emitted are exactly those greedy decoding would emit, one step at a time.
"""
from __future__ import annotations

import torch

from sarathi_lab.executors.base import StepResult


def spec_lens(out) -> list[int] | None:
    """The batch's speculation lengths (aligned with out.reqs), or None when no entry has any."""
    lens = out.spec_lens
    return lens if lens and any(lens) else None


def check_entries(ex, out, lens) -> None:
    """A speculative entry must be a decode (its first token its last emitted one) of a request
    decoded greedily: the verification is greedy. And there must be a draft (a run checks it
    at start-up; an engine built by hand may not have)."""
    if ex.draft is None:
        raise ValueError("a batch with speculative entries (SchedulerOutput.spec_lens) on a torch "
                         "executor without executor.draft: nothing proposes their tokens")
    for r, n, k in zip(out.reqs, out.num_new_tokens, lens):
        if not k:
            continue
        if n != 1 + k or r.num_computed_tokens + 1 != r.num_tokens:
            raise ValueError(
                f"request {r.request_id!r}: a speculative entry of k={k} must be a decode of "
                f"1 + k tokens after all of its KV, but it has {n} tokens at "
                f"{r.num_computed_tokens} of {r.num_tokens} computed (the policy broke the "
                "speculation rule of SchedulerOutput.add(req, n, spec=k))")
        own = ex.request_sampling.get(r.request_id)
        if own is not None and own[0] > 0:
            raise ValueError(
                f"request {r.request_id!r}: temperature={own[0]} with speculative decoding; the "
                "torch executor verifies drafts greedily (temperature 0 only)")


def propose(ex, out, lens) -> dict[int, list[int]]:
    """Entry index -> its k draft tokens, from k greedy forwards of the draft. The first feeds
    each entry's tokens from `draft.start` (its last token; a draft model with KV of its own
    to catch up: from where that is still right) to its last token, as one chunk."""
    reqs, draft = out.reqs, ex.draft
    entries = [i for i, k in enumerate(lens) if k]
    drafts = {i: [] for i in entries}
    for j in range(max(lens)):
        live = [i for i in entries if lens[i] > j]
        rs = [reqs[i] for i in live]
        if j == 0:
            starts = [draft.start(r) for r in rs]
            ns = [r.num_computed_tokens + 1 - s for r, s in zip(rs, starts)]
            ids = [t for r, s in zip(rs, starts) for t in r.all_token_ids()[s:]]
        else:
            starts = [r.num_computed_tokens + j for r in rs]
            ns = [1] * len(rs)
            ids = [drafts[i][-1] for i in live]
        positions, meta, cu = ex.batch_metadata(rs, starts, ns, not draft.own_cache)
        rows = (cu[1:] - 1).to(ex.device)
        logits = draft(torch.tensor(ids, device=ex.device), positions, meta, rows)
        for i, tok in zip(live, logits.argmax(dim=-1).tolist()):
            drafts[i].append(tok)
    return drafts


def verify(target: list[int], draft: list[int]) -> tuple[int, int]:
    """(accepted drafts, the token the target emits after them), from the target's argmax
    `target` (len(draft) + 1 rows) and the draft tokens."""
    a = 0
    while a < len(draft) and draft[a] == target[a]:
        a += 1
    return a, target[a]


def finish_step(ex, out, lens, logits, sample, drafts) -> tuple[StepResult, dict[int, int]]:
    """The step's result (its times left to the caller) and, per speculative entry, how many of
    its tokens' KV stays (1 + accepted). `logits` holds, in `sample`'s order, one row per ordinary
    entry that samples and 1 + k rows per speculative one."""
    reqs = out.reqs
    n = len(reqs)
    sampled, accepted, accepted_ids = [-1] * n, [0] * n, [[] for _ in range(n)]
    plain_rows, plain, kept, row = [], [], {}, 0
    for i in sample:
        k = lens[i]
        if k:
            target = logits[row:row + 1 + k].argmax(dim=-1).tolist()
            accepted[i], sampled[i] = verify(target, drafts[i])
            accepted_ids[i] = drafts[i][:accepted[i]]
            ex.draft.verified(reqs[i], reqs[i].num_computed_tokens, k, accepted[i])
            kept[i] = 1 + accepted[i]
            row += 1 + k
        else:
            plain_rows.append(row)
            plain.append(i)
            row += 1
    if plain:
        for i, tok in zip(plain, ex.sample(logits[plain_rows], [reqs[i] for i in plain])):
            sampled[i] = tok
    # the default stop rule (trace length, max_tokens, max_model_len) cuts each entry's
    # 1 + accepted tokens; then greedy decoding's own: nothing after an EOS is emitted
    emitted, ends = ex.speculative_ends(out, accepted)
    ends = set(ends)
    if ex.stop_at_eos:
        eos = ex.eos_ids
        for i in sample:
            toks = (accepted_ids[i] + [sampled[i]])[:emitted[i]]
            at = next((j for j, t in enumerate(toks) if t in eos), None)
            if at is not None and not ex._ignores_eos(reqs[i]):
                emitted[i] = at + 1
                ends.add(i)
                ex._eos_ended.add(reqs[i].request_id)
    return StepResult(duration=0.0, sampled=sampled, finished=sorted(ends), accepted=accepted,
                      accepted_ids=accepted_ids, emitted=emitted), kept
