"""`sarathi-lab-serve`'s own settings: the ``serve`` node of configs/serve.yaml."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.settings import setting


@dataclass
class ServeConfig:
    host: str = setting("127.0.0.1", help="the address bound; 0.0.0.0 serves other machines")
    port: int = setting(8000, ge=0, le=65535, help="0: a free port (printed at start-up)")
    max_queue: int = setting(64, ge=1, help="requests accepted and not yet ended; an arrival "
                                            "beyond it gets HTTP 429")
    model_name: str | None = setting(None, help="the name clients send as `model`; null: "
                                                "model.name")
    tokenizer: str | None = setting(None, help="a local Hugging Face tokenizer dir; null: "
                                               "model.path's, if it holds one")
    api_key: str | None = setting(None, help="the key every route but /health asks for "
                                             "(Authorization: Bearer <key>); null: the "
                                             "SARATHI_LAB_API_KEY environment variable's, else "
                                             "none")
