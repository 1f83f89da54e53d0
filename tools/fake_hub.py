#!/usr/bin/env python3
"""A Hugging Face Hub stand-in on loopback, for benchmarking and trying `trit pull` by hand.

Serves every file under FOLDER as repository REPO at one fixed commit, with the endpoints and
headers `trit pull` and Python's huggingface_hub use: the model info listing
(`/api/models/REPO/revision/REV`), the tree listing (`/api/models/REPO/tree/REV`) and
`/REPO/resolve/REV/FILE` (ETag, X-Repo-Commit, X-Linked-Etag/-Size, Range). Files ending in
.safetensors/.gguf/.bin are listed as LFS files (sha256), the others by git blob sha1.

    python3 tools/fake_hub.py FOLDER owner/name [--port 8765] [--tls CERT.pem KEY.pem]
    HF_ENDPOINT=http://127.0.0.1:8765 trit pull owner/name

Loopback only; stop it with Ctrl-C. (The Rust tests have their own server in
crates/trit-cli/tests/common/fake_hub.rs.)
"""

import argparse
import hashlib
import json
import os
import re
import ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def describe(root):
    files = {}
    for dirpath, _, names in os.walk(root):
        for n in sorted(names):
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            size = os.path.getsize(full)
            sha1 = hashlib.sha1(f"blob {size}\0".encode())
            sha256 = hashlib.sha256()
            with open(full, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    sha1.update(chunk)
                    sha256.update(chunk)
            lfs = rel.endswith(LFS_SUFFIXES)
            files[rel] = {"full": full, "size": size, "sha1": sha1.hexdigest(),
                          "sha256": sha256.hexdigest() if lfs else None}
    return files


def make_handler(repo, files):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send_json(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_HEAD(self):
            self.serve(head=True)

        def do_GET(self):
            self.serve(head=False)

        def serve(self, head):
            path = self.path.split("?")[0]
            if path.startswith(f"/api/models/{repo}/revision/"):
                sib = []
                for rel, f in files.items():
                    e = {"rfilename": rel, "size": f["size"], "blobId": f["sha1"]}
                    if f["sha256"]:
                        e["lfs"] = {"sha256": f["sha256"], "size": f["size"], "pointerSize": 134}
                    sib.append(e)
                return self.send_json({"id": repo, "sha": COMMIT, "siblings": sib})
            if path.startswith(f"/api/models/{repo}/tree/"):
                tree = []
                for rel, f in files.items():
                    e = {"type": "file", "path": rel, "size": f["size"], "oid": f["sha1"]}
                    if f["sha256"]:
                        e["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}
                    tree.append(e)
                return self.send_json(tree)
            m = re.match(rf"^/{re.escape(repo)}/resolve/[^/]+/(.+)$", path)
            f = files.get(m.group(1)) if m else None
            if f is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            etag = f["sha256"] or f["sha1"]
            total = f["size"]
            start = 0
            rng = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
            if rng and int(rng.group(1)) < total:
                start = int(rng.group(1))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{total - 1}/{total}")
            else:
                self.send_response(200)
            self.send_header("ETag", f'"{etag}"')
            self.send_header("X-Repo-Commit", COMMIT)
            if f["sha256"]:
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(total))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(total - start))
            self.end_headers()
            if head:
                return
            with open(f["full"], "rb") as fh:
                fh.seek(start)
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    self.wfile.write(chunk)

    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("repo")
    ap.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="serve HTTPS")
    a = ap.parse_args()
    files = describe(a.folder)
    server = ThreadingHTTPServer(("127.0.0.1", a.port), make_handler(a.repo, files))
    scheme = "http"
    if a.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.tls[0], a.tls[1])
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    port = server.server_address[1]
    print(f"serving {len(files)} files of {a.repo} at {scheme}://127.0.0.1:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
