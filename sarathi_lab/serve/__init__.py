"""`sarathi-lab-serve`: any policy and the real executor behind an OpenAI-compatible HTTP server
(sarathi_lab/docs/serving.md). Modules: `command` (the command: config, build, serve, write the
run directory), `app` (the HTTP routes), `worker` (the engine in real time, in its thread),
`protocol` (request bodies, errors, responses), `text` (tokenizer and streamed text),
`settings` (the ``serve`` node). aiohttp (the ``serve`` extra) is imported only here.
"""
