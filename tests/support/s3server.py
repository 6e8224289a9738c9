"""An S3-compatible server on loopback for the store's tests: moto's server mode (``moto[server]``, a
real HTTP server speaking the S3 REST API; boto3 reaches it through ``AWS_ENDPOINT_URL`` as it reaches
R2 or MinIO), and a bucket that refuses every write with S3's own ``AccessDenied`` answer.

``s3_server`` (fixture) starts one server for the test, points this process's AWS_* variables at it
(fake keys: moto accepts any), creates the bucket ``runs`` and yields its endpoint."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

ACCESS_KEY = "AKIAGPUCLITESTKEY000"
SECRET_KEY = "gpucli-test-secret-never-shown-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer  # test extra: moto[server]

        self.port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> S3Server:
        import requests

        self.server.start()
        # moto keeps its buckets in this process, shared by every server it runs: each test starts empty
        requests.post(f"{self.endpoint}/moto-api/reset", timeout=30).raise_for_status()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1"}

    def client(self) -> Any:
        import boto3  # test extra / store extra

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)

    def keys(self, bucket: str = "runs") -> dict[str, int]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return {o["Key"]: o["Size"] for p in pages for o in p.get("Contents") or ()}


class RefusingBucket:
    """Every request answered as S3 answers a key without permission: 403 with an AccessDenied body."""

    BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
            b"<Message>Access Denied</Message><RequestId>0</RequestId></Error>")

    def __init__(self) -> None:
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _deny(self) -> None:
                outer.requests += 1
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                self.send_response(403)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(RefusingBucket.BODY)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(RefusingBucket.BODY)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _deny  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RefusingBucket:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    with S3Server() as server:
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        server.client().create_bucket(Bucket="runs")
        yield server
