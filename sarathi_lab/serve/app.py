"""The HTTP side (aiohttp): the OpenAI routes, their errors, server-sent events, the queue bound.

Each completion request is read (`protocol.parse_generation`), checked against the model's
length (413) and the queue bound (429), handed to the worker, and answered from what the worker
posts to its channel: whole, or as server-sent events while tokens come. A client that goes
away cancels its handler (aiohttp's handler cancellation), which aborts the request in the
engine and frees its KV.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections import Counter

from aiohttp import web

from sarathi_lab.serve.engine_client import Channel, EngineClient
from sarathi_lab.serve.protocol import ApiError, choice, new_id, parse_generation, response, usage
from sarathi_lab.serve.text import Detokenizer

COMPLETION_ROUTES = ("/v1/completions", "/v1/chat/completions")
OPEN_ROUTES = ("/health",)   # answered without the API key (a load balancer's probe)
_STREAM = "sarathi_lab.stream"   # a request's prepared stream, if any (request[_STREAM])
log = logging.getLogger(__name__)


class Server:
    """The routes over one engine process (`worker`: its `EngineClient`, ready). `counts`: the
    answers to completion requests (both routes) by HTTP status, the summary's record.
    `metrics`: the `serve.metrics.Metrics` that `/metrics` shows."""

    def __init__(self, worker: EngineClient, model_name: str, max_queue: int, tokenizer=None,
                 api_key: str | None = None, metrics=None):
        self.worker, self.model_name, self.max_queue = worker, model_name, max_queue
        self.tokenizer, self.metrics = tokenizer, metrics
        self.api_key = api_key   # None: every route open
        info = worker.info
        self.max_model_len = info["max_model_len"]
        self.vocab_size = info["vocab_size"]
        self.defaults = tuple(info["defaults"])
        self.per_request_sampling = info["per_request_sampling"]
        self.in_flight = 0
        self.port: int | None = None   # once bound
        self.counts: Counter = Counter()
        self.stopping = False

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._auth],
                              client_max_size=64 * 2**20)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        return app

    @web.middleware
    async def _errors(self, request, handler):
        """Every error an OpenAI error object, never a crash; completion answers counted."""
        try:
            resp = await handler(request)
        except ApiError as e:
            resp = web.json_response(e.body(), status=e.status)
        except web.HTTPException as e:   # aiohttp's own: unknown route, wrong method
            code = "not_found" if e.status == 404 else None
            resp = web.json_response(ApiError(e.status, f"{request.method} {request.path}: "
                                              f"{e.reason}", code=code).body(), status=e.status)
        except ConnectionError:   # the client went away mid-answer: nobody to tell
            raise
        except Exception as e:   # a bug: said as an error object, never aiohttp's plain text
            log.exception("%s %s failed", request.method, request.path)
            err = ApiError(500, f"internal error: {type(e).__name__}: {e}",
                           code="internal_error")
            resp = request.get(_STREAM)
            if resp is None:
                resp = web.json_response(err.body(), status=500)
            else:   # mid-stream: the status is sent; the stream ends with the error event
                try:
                    await _event(resp, err.body())
                except Exception:   # the client is gone
                    pass
        if request.path in COMPLETION_ROUTES:
            self.counts[resp.status] += 1
        return resp

    @web.middleware
    async def _auth(self, request, handler):
        """`serve.api_key`: every route but /health needs `Authorization: Bearer <key>`."""
        if self.api_key is not None and request.path not in OPEN_ROUTES:
            sent = request.headers.get("Authorization", "")
            scheme, _, token = sent.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    token.strip().encode(), self.api_key.encode()):
                why = "incorrect API key provided" if sent else \
                    "no API key: send the header 'Authorization: Bearer <key>'"
                raise ApiError(401, why, code="invalid_api_key")
        return await handler(request)

    # -- routes ------------------------------------------------------------------------------
    async def models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "sarathi-lab",
             "max_model_len": self.max_model_len}]})

    async def health(self, request):
        w = self.worker
        ok = w.error is None and not self.stopping
        return web.json_response({"status": "ok" if ok else "error", "in_flight": self.in_flight,
                                  "max_queue": self.max_queue, **w.stats},
                                 status=200 if ok else 503)

    async def prometheus(self, request):
        body, ctype = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": ctype})

    async def completions(self, request):
        return await self._generate(request, chat=False)

    async def chat(self, request):
        return await self._generate(request, chat=True)

    # -- one generation ----------------------------------------------------------------------
    async def _read(self, request, chat: bool):
        try:
            body = json.loads(await request.text())
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON ({e})") from None
        except RecursionError:   # json.loads' depth bound: nothing here nests that deep
            raise ApiError(400, "the request body is not valid JSON here: it nests deeper "
                           "than the server reads") from None
        g = parse_generation(body, chat, self.tokenizer, self.vocab_size, self.defaults)
        if g.model != self.model_name:
            if g.model is None:
                raise ApiError(400, f"model: required (this server serves {self.model_name!r})",
                               "model")
            raise ApiError(404, f"model {g.model!r} does not exist; this server serves "
                           f"{self.model_name!r}", "model", "model_not_found")
        if not self.per_request_sampling and ((g.temperature, g.top_p) != self.defaults
                                              or g.seed is not None or g.ignore_eos):
            raise ApiError(400, f"temperature/top_p/seed/ignore_eos: executor "
                           f"{self.worker.info['executor']} samples only with its "
                           f"settings {self.defaults}", "temperature")
        if g.temperature > 0 and self.worker.info["greedy_only"]:
            raise ApiError(400, f"temperature={g.temperature}: this server decodes "
                           "speculatively (executor.draft) and verifies the drafts greedily; "
                           "send temperature 0", "temperature")
        n = len(g.prompt_ids)
        if n + 1 > self.max_model_len:
            raise ApiError(413, f"the prompt has {n} tokens; max_model_len={self.max_model_len} "
                           "leaves no room for a token", "prompt" if not chat else "messages",
                           "context_length_exceeded")
        return g

    async def _generate(self, request, chat: bool):
        g = await self._read(request, chat)
        if self.stopping or self.worker.error is not None:
            raise ApiError(503, "the server is stopping" if self.stopping else
                           f"the engine stopped: {self.worker.error}", code="unavailable")
        if self.in_flight >= self.max_queue:
            raise ApiError(429, f"the queue is full: {self.in_flight} requests in flight "
                           f"(serve.max_queue={self.max_queue})", code="queue_full")
        self.in_flight += 1
        channel = Channel(asyncio.get_running_loop())
        rid = self.worker.submit(g, channel)
        ended = False
        try:
            if g.stream:
                resp = await self._stream(request, g, channel)
            else:
                resp = await self._whole(g, channel)
            ended = True
            return resp
        except ApiError:
            ended = True   # the worker refused or ended it: nothing to abort
            raise
        finally:
            self.in_flight -= 1
            if not ended:   # the client went away (its handler cancelled) or writing failed
                self.worker.abort(rid)

    async def _whole(self, g, channel: Channel):
        ids: list[int] = []
        while True:
            event = await channel.queue.get()
            if event[0] == "error":
                raise event[1]
            _, new, finish = event
            ids += new
            if finish is not None:
                text = Detokenizer(self.tokenizer, g.stop).add(ids, final=True)
                c = choice(g, text, ids, finish, first=True, whole=True)
                return web.json_response(response(g, new_id(g.chat), [c], whole=True,
                                                  use=usage(len(g.prompt_ids), len(ids))))

    async def _stream(self, request, g, channel: Channel):
        """One chunk per engine event: its tokens, and on the last one the finish reason (as
        vLLM sends it: no empty closing chunk, which a client timing chunks would count as
        one more inter-token gap); then the usage in a chunk of its own, if asked."""
        detok = Detokenizer(self.tokenizer, g.stop)
        rid = new_id(g.chat)
        resp = None
        n_out = 0
        while True:
            event = await channel.queue.get()
            if event[0] == "error":
                if resp is None:   # before the first token: an HTTP error status
                    raise event[1]
                await _event(resp, event[1].body())
                break
            if resp is None:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})
                await resp.prepare(request)
                request[_STREAM] = resp
            _, ids, finish = event
            first = n_out == 0
            n_out += len(ids)
            c = choice(g, detok.add(ids, final=finish is not None), ids, finish, first=first,
                       whole=False)
            # continuous_usage_stats (vLLM's): every chunk carries the usage so far
            use = usage(len(g.prompt_ids), n_out) if g.continuous_usage else None
            await _event(resp, response(g, rid, [c], whole=False, use=use))
            if finish is not None:
                if g.include_usage:
                    await _event(resp, response(g, rid, [], whole=False,
                                                use=usage(len(g.prompt_ids), n_out)))
                break
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def _event(resp, obj: dict) -> None:
    await resp.write(f"data: {json.dumps(obj)}\n\n".encode())
