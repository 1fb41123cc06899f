#!/usr/bin/env python3
"""A pass-through HTTP proxy that times each model request between forkd and llama-server.

forkd does not record when a response's first token arrived, so scripts/real-model.sh puts this
proxy between forkd's `anthropic` provider and llama-server. It forwards every request and
response unchanged (bodies, statuses, headers apart from hop-by-hop ones), streaming the SSE
response line by line as it arrives, and appends one JSON object per request to a log:

  t_request      when the request arrived (epoch seconds)
  t_first_event  when the first SSE event (llama-server's message_start) came back; llama-server
                 sends it with the first generated token, so this is the time to first token
  t_end          when the response ended
  usage          message_start's usage, with message_delta's output_tokens
  model          the model the response named
  directive      the text of the request's last content block (a fork child's directive)
  status, path, request_bytes

Only the standard library; loopback only.
"""

import argparse
import http.client
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
}


def last_text(body):
    """The text of the last text block of the last message: a fork child's directive."""
    try:
        messages = json.loads(body).get("messages") or []
    except (ValueError, AttributeError):
        return None
    if not messages:
        return None
    content = messages[-1].get("content")
    if isinstance(content, str):
        return content
    for block in reversed(content or []):
        if isinstance(block, dict) and block.get("type") == "text":
            return block.get("text")
    return None


class Proxy(BaseHTTPRequestHandler):
    upstream = ("127.0.0.1", 8080)
    log_file = None
    lock = threading.Lock()
    # Answer as HTTP/1.0: the streamed body ends when the connection closes.
    protocol_version = "HTTP/1.0"

    def log_message(self, fmt, *args):
        pass

    def record(self, entry):
        with self.lock:
            self.log_file.write(json.dumps(entry) + "\n")
            self.log_file.flush()

    def do_GET(self):
        self.forward(None)

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        self.forward(self.rfile.read(length) if length else b"")

    def forward(self, body):
        t_request = time.time()
        upstream = http.client.HTTPConnection(*self.upstream, timeout=600)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        upstream.request(self.command, self.path, body=body, headers=headers)
        response = upstream.getresponse()
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("Connection", "close")
        self.end_headers()

        entry = {
            "path": self.path,
            "status": response.status,
            "t_request": t_request,
            "t_first_event": None,
            "t_end": None,
            "usage": None,
            "model": None,
            "directive": None,
            "request_bytes": len(body or b""),
        }
        if body and self.path.startswith("/v1/messages") and not self.path.endswith("count_tokens"):
            entry["directive"] = last_text(body)
        is_stream = response.getheader("content-type", "").startswith("text/event-stream")
        try:
            while True:
                line = response.readline() if is_stream else response.read(65536)
                if not line:
                    break
                if is_stream and line.startswith(b"data:"):
                    self.note_event(entry, line[5:])
                self.wfile.write(line)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            entry["error"] = "the client went away"
        finally:
            entry["t_end"] = time.time()
            upstream.close()
            if self.path.startswith("/v1/messages") and self.command == "POST":
                self.record(entry)

    @staticmethod
    def note_event(entry, data):
        try:
            event = json.loads(data)
        except ValueError:
            return
        if entry["t_first_event"] is None:
            entry["t_first_event"] = time.time()
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            entry["usage"] = dict(message.get("usage") or {})
            entry["model"] = message.get("model")
        elif kind == "message_delta" and entry["usage"] is not None:
            entry["usage"]["output_tokens"] = (event.get("usage") or {}).get("output_tokens")
        elif "message" in event and "type" in event and kind.endswith("_error"):
            entry["error"] = event["message"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    Proxy.upstream = ("127.0.0.1", args.upstream_port)
    Proxy.log_file = open(args.log, "a", encoding="utf-8")
    server = ThreadingHTTPServer(("127.0.0.1", args.listen_port), Proxy)
    server.daemon_threads = True
    print(f"timing proxy on 127.0.0.1:{args.listen_port} -> :{args.upstream_port}", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
