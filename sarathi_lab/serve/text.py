"""Token ids to text for a stream: the tokenizer, loaded once, and the incremental decoder that
sends only text that will not change (a token that ends inside a UTF-8 character, or text that
may yet become a stop string, is held back). Without a tokenizer a token's text is
`token_id:<id>`."""
from __future__ import annotations

from pathlib import Path

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def load_tokenizer(path: str | None, model_path: str | None, where: str = "serve.tokenizer"):
    """The tokenizer of `path` (serve.tokenizer), else of `model_path` when that dir holds
    one; None when neither gives one (then prompts must be token ids)."""
    src = path or model_path
    if not src:
        return None
    d = Path(str(src)).expanduser()
    if not path and not any((d / f).is_file() for f in _TOKENIZER_FILES):
        return None   # a model dir without tokenizer files: token ids only
    if not d.is_dir():
        raise ValueError(f"{where}={src!r}: not a directory")
    from transformers import AutoTokenizer  # heavy: only when a tokenizer is used
    try:
        return AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    except Exception as e:
        raise ValueError(f"{where}={src!r}: no tokenizer could be loaded from it ({e})") from None


class StopWatch:
    """Whether a request's growing output has reached one of its stop strings. Each step costs
    its new tokens: decoding the whole output every step (as before) was quadratic in its
    length. Only the text a new token can complete is searched: a stop string that ends in it
    starts at most len(stop) - 1 characters before it."""

    def __init__(self, tokenizer, stops: list[str]):
        self.detok = Detokenizer(tokenizer, stops)
        self.stops = stops
        self.span = max(map(len, stops)) - 1
        self.searched = 0   # characters of the text already searched

    def add(self, ids: list[int]) -> bool:
        self.detok.add(ids)
        text = self.detok.text
        tail = text[max(0, self.searched - self.span):]
        self.searched = len(text)
        return any(s in tail for s in self.stops)


class Detokenizer:
    """The text of a growing list of token ids, handed out in pieces that never change.

    Incremental, as vLLM's: each new token is decoded with the tokens handed out before it as
    context (`prefix`..`read`), so a token's leading space or a character split over tokens
    comes out as decoding the whole would, and a step costs the new tokens, not the output."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.text = ""   # the text decoded so far
        self.prefix = self.read = 0   # ids[prefix:read]: the context of the next decode
        self.sent = 0   # characters handed out
        self.hold = max(map(len, stops), default=1) - 1

    def add(self, ids: list[int], final: bool = False) -> str:
        """The new text after `ids`; with `final`, everything left (cut at a stop string)."""
        self.ids += ids
        tok = self.tokenizer
        if tok is None:
            # no text without a tokenizer: each token written as vLLM's
            # --return-tokens-as-token-ids writes it, so that a client counting text chunks
            # (most load generators) sees every token
            return "".join(f"token_id:{t}" for t in ids)
        before = tok.decode(self.ids[self.prefix:self.read], skip_special_tokens=True)
        after = tok.decode(self.ids[self.prefix:], skip_special_tokens=True)
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            self.text += after[len(before):]
            self.prefix, self.read = self.read, len(self.ids)
        text = self.text
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            end = cut
        elif final:
            end = len(text)
        else:
            end = len(text) - self.hold
        piece = text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece
