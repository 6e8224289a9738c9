"""A Hugging Face Hub emulator: the endpoints ``huggingface_hub`` calls to create a model repository and
upload a folder into it (``HfApi.create_repo`` then ``upload_folder``), at ``HF_ENDPOINT``.

- ``POST /api/repos/create`` {name, organization, private}: 200 {url}, 409 when it exists;
- ``POST /api/models/{org}/{name}/preupload/{revision}`` {files: [{path, sample, size}]}: every file
  "regular" (its bytes travel base64 inside the commit), none ignored;
- ``POST /api/models/{org}/{name}/commit/{revision}``: NDJSON, a header line then one line per file
  ``{"key": "file", "value": {"path", "content", "encoding": "base64"}}``: 200 {commitUrl, commitOid}.

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
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(preupload|commit)/([^/]+)", path)
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
        oid = hashlib.sha1(json.dumps(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in repo.files.items()))
                           .encode()).hexdigest()
        repo.commits.append(oid)
        return 200, {"commitUrl": f"{self.url}/{m.group(1)}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}
