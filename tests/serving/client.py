"""A minimal OpenAI-API client for tp serve's tests, on the standard library only
(http.client): whole responses, server-sent event streams with their timings,
a stream that hangs up halfway, and a whole request hung up on."""
import http.client
import json
import socket
import time
import urllib.parse


class Server:
    def __init__(self, url, api_key=None, timeout=120):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port
        self.api_key = api_key
        self.timeout = timeout

    def _conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def _headers(self, extra=None):
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        h.update(extra or {})
        return h

    def wait_healthy(self, seconds=60, proc=None):
        """Polls /health until it answers 200; fails if `proc` (a Popen) exits first."""
        end = time.time() + seconds
        while time.time() < end:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode} before it was healthy")
            try:
                c = self._conn()
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"no /health on {self.host}:{self.port} after {seconds} s")

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, parsed JSON body or None)."""
        c = self._conn()
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=self._headers(headers))
        r = c.getresponse()
        text = r.read().decode()
        try:
            return r.status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return r.status, text

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def stream(self, path, body, stop_after=None):
        """Streams `body` (stream: true is added). Returns a dict: status, chunks
        (parsed data events), times (s from the request to each chunk), done (saw
        [DONE]), ttft (s to the first chunk with text or token ids), seconds.
        stop_after=k: hang up after k chunks."""
        body = dict(body, stream=True)
        c = self._conn()
        t0 = time.time()
        c.request("POST", path, body=json.dumps(body), headers=self._headers())
        r = c.getresponse()
        out = {"status": r.status, "chunks": [], "times": [], "done": False, "ttft": None}
        if r.status != 200:
            out["error"] = json.loads(r.read().decode())
            return out
        buf = b""
        while True:
            line = r.fp.readline()
            if not line:
                break
            line = line.rstrip(b"\r\n")
            if not line.startswith(b"data: "):
                continue  # blank separators and ": keep-alive" comments
            payload = line[6:]
            if payload == b"[DONE]":
                out["done"] = True
                break
            chunk = json.loads(payload)
            out["chunks"].append(chunk)
            out["times"].append(time.time() - t0)
            choices = chunk.get("choices") or [{}]
            ch = choices[0]
            if out["ttft"] is None and (ch.get("text") or ch.get("token_ids") or (ch.get("delta") or {}).get("content")):
                out["ttft"] = time.time() - t0
            if stop_after is not None and len(out["chunks"]) >= stop_after:
                c.sock.shutdown(socket.SHUT_RDWR)
                c.close()
                break
        out["seconds"] = time.time() - t0
        return out

    def post_and_hang_up(self, path, body, after_s):
        """Posts `body` (not streamed) and closes the connection after_s seconds
        later without reading the answer."""
        c = self._conn()
        c.request("POST", path, body=json.dumps(body), headers=self._headers())
        time.sleep(after_s)
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()


def stream_tokens(result):
    """Token ids and text of a streamed completion (return_token_ids), and its finish reason."""
    ids, text, finish = [], "", None
    for chunk in result["chunks"]:
        for ch in chunk.get("choices", []):
            ids += ch.get("token_ids") or []
            text += ch.get("text") or (ch.get("delta") or {}).get("content") or ""
            finish = ch.get("finish_reason") or finish
    return ids, text, finish
