#!/usr/bin/env python3
"""The web hosts of the tests' fake internet (testcluster/src/fake_internet.rs).

Python 3 standard library only. Started inside the fake internet's network namespace with one
argument, a JSON file:

    {"ready": "/path/ready", "hosts": [{"name": "allowed.test", "address": "198.18.1.1",
                                        "cert": "/path/allowed.test.pem", "key": "/path/allowed.test.key"}]}

Every host serves HTTP on address:80 and HTTPS on address:443 (its own certificate, whatever name the
client asks for). Every answer is 200 with the body

    host=<name> path=<request target> sni=<server name the TLS client sent, or ->\n

except `GET /big?bytes=N` (N bytes of `x`, for throughput), `GET /slow` (`?seconds=S`, default 60:
one line a second, `host=<name> second=<i>\n`, with a Content-Length for all of them, so a client
sees a cut connection as a short body), `GET /files/orchard_probe-1.0-py3-none-any.whl` (a valid
one-module wheel, for pip) and `GET /repo.git/...` (a one-commit repository over git's dumb HTTP
protocol, for `git clone`). Writes the `ready` file once every listener is bound, then
serves until killed.
"""

import base64
import hashlib
import http.server
import io
import json
import os
import subprocess
import tempfile
import zipfile
import signal
import socketserver
import ssl
import sys
import threading
import time
import urllib.parse

CHUNK = 64 * 1024

WHEEL_NAME = "orchard_probe-1.0-py3-none-any.whl"


def wheel():
    """A valid pure-Python wheel of one module (what `pip download` checks: name, version, tags)."""
    files = {
        "orchard_probe/__init__.py": b"VALUE = 'orchard'\n",
        "orchard_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: orchard-probe\nVersion: 1.0\n",
        "orchard_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: fake-internet\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("orchard_probe-1.0.dist-info/RECORD,,")
    files["orchard_probe-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return out.getvalue()


def bare_repository(under):
    """A bare one-commit repository (README: `orchard`) ready for git's dumb HTTP protocol, in a new
    directory under `under` (the run's directory, removed with it)."""
    root = tempfile.mkdtemp(prefix="git-", dir=under)
    work, bare = os.path.join(root, "work"), os.path.join(root, "repo.git")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", GIT_CONFIG_NOSYSTEM="1", HOME=root)
    git = lambda *args: subprocess.run(["git", *args], check=True, env=env, capture_output=True)
    git("init", "-q", "-b", "main", work)
    with open(os.path.join(work, "README"), "w") as f:
        f.write("orchard\n")
    git("-C", work, "add", "README")
    git("-C", work, "commit", "-q", "-m", "one")
    git("clone", "-q", "--bare", "--no-local", work, bare)
    git("-C", bare, "update-server-info")
    return bare


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address, handler, tls=None):
        self.tls = tls
        super().__init__(address, handler)

    def server_bind(self):
        # HTTPServer's own looks the address up in DNS (socket.getfqdn), which nothing here answers.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def finish_request(self, request, client_address):
        # The handshake runs in the connection's own thread, never in the accepting one.
        if self.tls is not None:
            request.settimeout(30)
            request = self.tls.wrap_socket(request, server_side=True)
            request.settimeout(None)
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address):
        kind, value = sys.exc_info()[:2]
        sys.stderr.write(f"{self.server_address[0]}:{self.server_address[1]} {client_address[0]}: {kind.__name__}: {value}\n")


def handler_for(name, files):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fake-internet"
        sys_version = ""

        def log_message(self, format, *args):
            sys.stderr.write(f"{name} {self.client_address[0]} " + (format % args) + "\n")

        def sni(self):
            return getattr(self.connection, "fake_internet_sni", None) or "-"

        def head(self, length, content_type="text/plain"):
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(length))
            self.end_headers()

        def answer(self, send_body=True):
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            if self.command == "GET" and url.path == "/big":
                self.big(int(query.get("bytes", ["0"])[0]))
            elif self.command == "GET" and url.path == "/slow":
                self.slow(int(query.get("seconds", ["60"])[0]))
            elif self.command == "GET" and url.path == "/files/" + WHEEL_NAME:
                self.head(len(files["wheel"]), "application/octet-stream")
                self.wfile.write(files["wheel"])
            elif self.command == "GET" and url.path.startswith("/repo.git/"):
                self.repository(url.path[len("/repo.git/"):])
            else:
                body = f"host={name} path={self.path} sni={self.sni()}\n".encode()
                self.head(len(body))
                if send_body:
                    self.wfile.write(body)

        def repository(self, relative):
            path = os.path.realpath(os.path.join(files["git"], relative))
            if not path.startswith(files["git"] + os.sep) or not os.path.isfile(path):
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with open(path, "rb") as f:
                data = f.read()
            self.head(len(data), "application/octet-stream")
            self.wfile.write(data)

        def big(self, size):
            self.head(size, "application/octet-stream")
            block = b"x" * CHUNK
            left = size
            while left > 0:
                self.wfile.write(block[: min(left, CHUNK)])
                left -= CHUNK

        def slow(self, seconds):
            lines = [f"host={name} second={i}\n".encode() for i in range(1, seconds + 1)]
            self.head(sum(len(line) for line in lines))
            for i, line in enumerate(lines):
                if i:
                    time.sleep(1)
                self.wfile.write(line)
                self.wfile.flush()

        def do_GET(self):
            self.answer()

        def do_HEAD(self):
            self.answer(send_body=False)

        do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    return Handler


def tls_context(cert, key):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    def record(sock, server_name, _context):
        # The socket's own attribute: the handler reads it back after the handshake.
        sock.fake_internet_sni = server_name

    context.sni_callback = record
    return context


def main():
    with open(sys.argv[1]) as f:
        config = json.load(f)
    servers = []
    files = {"wheel": wheel(), "git": os.path.realpath(bare_repository(os.path.dirname(config["ready"])))}
    for host in config["hosts"]:
        handler = handler_for(host["name"], files)
        servers.append(Server((host["address"], 80), handler))
        servers.append(Server((host["address"], 443), handler, tls_context(host["cert"], host["key"])))
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    with open(config["ready"], "w") as f:
        f.write("ready\n")
    sys.stderr.write(f"serving {len(config['hosts'])} hosts\n")
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
