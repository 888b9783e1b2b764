"""`sarathi-lab-serve` in a subprocess, and the in-process references, for the tests that talk to
it (tests/test_serve.py, test_serve_clients.py, test_serve_process.py)."""
import http.client
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers import TESTS, composed, patience

from sarathi_lab.engine import Engine
from sarathi_lab.request import Request, Status
from sarathi_lab.run import runner
from sarathi_lab.serve.launch import wait_for_address

PROMPT = [5, 17, 42, 99, 3, 250, 7]


def _tiny(name="sarathi", **sched):
    c = composed(f"scheduler={name}", "executor=torch", "model=tiny-llama",
                 "executor.device=cpu", "executor.kv_cache_gib=0.01")
    c["scheduler"].update(sched)
    return runner.build(c)


def _greedy(prompt, n) -> list[int]:
    """The in-process executor's greedy tokens for one prompt (as `sarathi-lab` runs it)."""
    policy, ex = _tiny()
    req = Request(0, 0.0, len(prompt), None, prompt_token_ids=list(prompt), max_tokens=n)
    Engine(policy, ex).run([req])
    assert req.status is Status.FINISHED and req.num_output_tokens == n
    return req.output_token_ids


def save_tokenizer(d: Path, tok, chat_template: str):
    """`tok` (a `tokenizers.Tokenizer` over ids 0 <unk>, 1 <s>, 2 </s>, ...) as a Hugging Face
    tokenizer directory with `chat_template`."""
    from transformers import PreTrainedTokenizerFast
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    fast.chat_template = chat_template
    fast.save_pretrained(d)
    return fast


class Served:
    """`sarathi-lab-serve` in a subprocess on a free 127.0.0.1 port; `stop()` sends SIGINT and
    returns the run directory it wrote."""

    def __init__(self, cwd: Path, *overrides, timeout=180, env=None):
        env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join([str(cwd), str(TESTS)]), **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from sarathi_lab.serve.command import main; main()",
             "serve.port=0", "executor.device=cpu", "executor.kv_cache_gib=0.02", *overrides],
            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.completed = 0      # completions answered 200 (streamed or whole)
        self.disconnected = 0   # streams the tests broke off
        try:
            _, self.port, self.out = wait_for_address(self.proc, patience(timeout))
        except RuntimeError as e:
            raise AssertionError(f"the server did not start: {e}{self.proc.stderr.read()}")

    def request(self, method, path, body=None, timeout=60, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=patience(timeout))
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data,
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        if method == "POST" and resp.status == 200:
            self.completed += 1
        return resp.status, json.loads(raw) if raw.startswith(b"{") else raw.decode()

    def stream(self, body):
        """The events of a streamed completion, [DONE] excluded."""
        status, text = self.request("POST", "/v1/completions", {**body, "stream": True})
        assert status == 200, text
        events = [e[len("data: "):] for e in text.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        return [json.loads(e) for e in events[:-1]]

    def stop(self, sig=signal.SIGINT, timeout=120) -> Path:
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=patience(timeout))
        assert self.proc.returncode == 0, err[-3000:]
        self.printed = out   # the summary it printed
        run_dir = Path(out.split("run directory: ")[1].strip())
        assert (run_dir / "summary.json").is_file()
        return run_dir

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
