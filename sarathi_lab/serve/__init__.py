"""`sarathi-lab-serve`: any policy and the real executor behind an OpenAI-compatible HTTP server
(sarathi_lab/docs/serving.md). Modules: `command` (the command: config, build, serve, write the
run directory), `app` (the HTTP routes), `engine_process` (the engine in a process of its own)
and `engine_client` (the HTTP side's end of it), `worker` (the engine in real time, in the
engine process), `metrics` (Prometheus, /metrics), `protocol` (request bodies, errors,
responses), `text` (tokenizer and streamed text), `settings` (the ``serve`` node). aiohttp,
msgspec and prometheus_client (the ``serve`` extra) are imported only here.
"""
