"""A Hugging Face Hub emulator: the endpoints ``huggingface_hub`` calls to create a model repository and
upload a folder into it (``HfApi.create_repo`` then ``upload_folder``), at ``HF_ENDPOINT``.

- ``POST /api/repos/create`` {name, organization, private}: 200 {url}, 409 when it exists;
- ``POST /api/models/{org}/{name}/preupload/{revision}`` {files: [{path, sample, size}]}: every file
  "regular" (its bytes travel base64 inside the commit), none ignored;
- ``POST /api/models/{org}/{name}/commit/{revision}``: NDJSON, a header line then one line per file
  ``{"key": "file", "value": {"path", "content", "encoding": "base64"}}``: 200 {commitUrl, commitOid}.

Reading back (a checkpoint store on the Hub, gpucli/store/objstore.py), for model and dataset repos:

- ``GET /api/{models|datasets}/{org}/{name}/tree/{revision}[/{path}]?recursive=...``: the files under
  ``path`` as ``[{"type": "file", "oid", "size", "path"}]`` (huggingface_hub's ``RepoFile``), 404 when
  there are none (the Hub's "does not exist");
- ``HEAD`` / ``GET /[datasets/]{org}/{name}/resolve/{revision}/{path}``: the file, with the headers
  ``hf_hub_download`` reads (``X-Repo-Commit``, ``ETag``, ``Content-Length``);
- a commit line ``{"key": "deletedFile", "value": {"path"}}`` deletes that file.

Every request must carry ``Authorization: Bearer <token>`` with the emulator's token (401 otherwise), as
writing to the real Hub does. Large files go through Git LFS on the real Hub; here they do not.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Repo:
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)


class HubEmulator:
    def __init__(self, token: str) -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Authorization header
        emu = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                emu.requests.append(("POST", self.path, self.headers.get("Authorization")))
                if self.headers.get("Authorization") != f"Bearer {emu.token}":
                    return self._json(401, {"error": "Invalid credentials in Authorization header"})
                status, obj = emu.post(self.path.split("?")[0], body)
                self._json(status, obj)

            def do_GET(self) -> None:  # noqa: N802
                self._get(body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._get(body=False)

            def _get(self, body: bool) -> None:
                emu.requests.append((self.command, self.path, self.headers.get("Authorization")))
                if self.headers.get("Authorization") != f"Bearer {emu.token}":
                    return self._json(401, {"error": "Invalid credentials in Authorization header"})
                status, data, headers = emu.get(self.path.split("?")[0])
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def _json(self, status: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubEmulator:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def post(self, path: str, body: bytes) -> tuple[int, dict]:
        if path == "/api/repos/create":
            req = json.loads(body)
            repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
            if repo_id in self.repos:
                return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
            self.repos[repo_id] = Repo(private=bool(req.get("private")))
            return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id}
        m = re.fullmatch(r"/api/(?:models|datasets)/([^/]+/[^/]+)/(preupload|commit)/([^/]+)", path)
        if not m or m.group(1) not in self.repos:
            return 404, {"error": "Repository not found"}
        repo = self.repos[m.group(1)]
        if m.group(2) == "preupload":
            files = json.loads(body)["files"]
            return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                                   for f in files]}
        for line in body.splitlines():
            item = json.loads(line)
            if item["key"] == "file":
                v = item["value"]
                assert v["encoding"] == "base64"
                repo.files[v["path"]] = base64.b64decode(v["content"])
            elif item["key"] == "deletedFile":
                repo.files.pop(item["value"]["path"], None)
        oid = hashlib.sha1(json.dumps(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in repo.files.items()))
                           .encode()).hexdigest()
        repo.commits.append(oid)
        return 200, {"commitUrl": f"{self.url}/{m.group(1)}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}

    def get(self, path: str) -> tuple[int, bytes, dict[str, str]]:
        from urllib.parse import unquote

        path = unquote(path)
        js = {"Content-Type": "application/json"}
        m = re.fullmatch(r"/api/(?:models|datasets)/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if m:
            repo = self.repos.get(m.group(1))
            under = (m.group(3) or "").strip("/")
            found = [{"type": "file", "oid": hashlib.sha1(v).hexdigest(), "size": len(v), "path": k}
                     for k, v in sorted((repo.files if repo else {}).items())
                     if not under or k == under or k.startswith(under + "/")]
            if not found:
                return 404, json.dumps({"error": f"{under} does not exist on main"}).encode(), js
            return 200, json.dumps(found).encode(), js
        m = re.fullmatch(r"/(?:datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        repo = self.repos.get(m.group(1)) if m else None
        if repo is None or m is None or m.group(3) not in repo.files:
            return 404, b'{"error": "Entry not found"}', {**js, "X-Error-Code": "EntryNotFound"}
        data = repo.files[m.group(3)]
        return 200, data, {"X-Repo-Commit": repo.commits[-1] if repo.commits else "0" * 40,
                           "ETag": f'"{hashlib.sha1(data).hexdigest()}"', "Content-Type": "application/octet-stream"}
