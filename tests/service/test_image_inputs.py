"""Image decoding guards and URL images (SSRF guard, allowlist, size and time limits)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import io
import ipaddress
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpcore
import httpx
import numpy as np
import pytest
from PIL import Image

from clipcore.errors import ClipError, ErrorCode
from service.images import check_url, decode_base64, decode_image, is_public_address
from service.runtime.image_inputs import INLINE_BASE64_CHARS

# ----------------------------------------------------------------------------- unit


def png_bytes(image: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


def test_decode_base64_strict_and_sized() -> None:
    data = b"\x00\x01binary"
    assert decode_base64(base64.b64encode(data).decode(), "f", 100) == data
    assert decode_base64("data:image/png;base64," + base64.b64encode(data).decode(), "f", 100) == data
    for bad in ("abc", "ab!=", "===="):
        with pytest.raises(ClipError) as info:
            decode_base64(bad, "images.0.data", 100)
        assert info.value.code == ErrorCode.bad_input and info.value.field == "images.0.data"
    with pytest.raises(ClipError) as info:
        decode_base64(base64.b64encode(b"x" * 200).decode(), "f", 100)
    assert info.value.code == ErrorCode.payload_too_large


def test_decode_base64_takes_wrapped_lines_and_refuses_other_characters() -> None:
    data = bytes(range(256)) * 4
    wrapped = base64.encodebytes(data).decode()  # MIME: a line break every 76 characters
    assert "\n" in wrapped and decode_base64(wrapped, "f", 2000) == data
    assert decode_base64(wrapped.replace("\n", "\r\n"), "f", 2000) == data
    for bad, message in (
        ("  \n\t", "empty"),
        ("", "empty"),
        ("QUJD\u00e9", "not valid base64"),
        ("QU JD!", "not valid"),
    ):
        with pytest.raises(ClipError, match=message) as info:
            decode_base64(bad, "images.0.data", 100)
        assert info.value.code == ErrorCode.bad_input and info.value.field == "images.0.data"


def test_decode_image_checks_pixels_before_loading() -> None:
    bomb = png_bytes(Image.new("1", (20000, 20000)))
    with pytest.raises(ClipError) as info:
        decode_image(bomb, "f", 40_000_000)
    assert info.value.code == ErrorCode.payload_too_large
    with pytest.raises(ClipError) as info:
        decode_image(png_bytes(Image.new("RGB", (101, 100))), "f", 100 * 100)
    assert info.value.code == ErrorCode.payload_too_large


def test_decode_image_flattens_alpha_and_takes_first_gif_frame() -> None:
    clear = decode_image(png_bytes(Image.new("RGBA", (4, 4), (0, 0, 0, 0))), "f", 10_000)
    assert clear.mode == "RGB" and clear.getpixel((0, 0)) == (255, 255, 255)
    frames = [Image.new("RGB", (8, 8), c).convert("P") for c in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    first = decode_image(buf.getvalue(), "f", 10_000)
    r, _g, b = first.getpixel((0, 0))
    assert r > 200 and b < 50


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("192.168.0.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("::1", False),
        ("fe80::1", False),
        ("fd00::1", False),
        ("::ffff:127.0.0.1", False),
        ("2001:4860:4860::8888", True),
        ("224.0.0.1", False),
    ],
)
def test_ssrf_address_classification(address: str, public: bool) -> None:
    assert is_public_address(address) is public


@pytest.mark.parametrize(
    ("address", "public"),
    [
        # NAT64 well-known prefix: on a NAT64 network these reach loopback and the metadata service.
        ("64:ff9b::7f00:1", False),
        ("64:ff9b::a9fe:a9fe", False),
        ("64:ff9b::a00:1", False),
        ("64:ff9b::808:808", True),
        # NAT64 local-use prefix: where the IPv4 sits depends on the operator's prefix length.
        ("64:ff9b:1::7f00:1", False),
        ("64:ff9b:1:808:8:800::", False),
        # 6to4: the IPv4 address of the tunnel end is bits 16-47.
        ("2002:7f00:1::", False),
        ("2002:a9fe:a9fe::1", False),
        ("2002:808:808::1", True),
        # IPv4-compatible (deprecated) and IPv4-translated (SIIT).
        ("::127.0.0.1", False),
        ("::169.254.169.254", False),
        ("::ffff:0:127.0.0.1", False),
        ("::ffff:0:8.8.8.8", True),
        # IPv4-mapped: the IPv4 peer itself.
        ("::ffff:169.254.169.254", False),
        ("::ffff:8.8.8.8", True),
        # Teredo: server 65.54.227.120, client 127.0.0.1 obfuscated (each bit inverted).
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", False),
        ("2001:0:4136:e378:8000:63bf:5601:5601", False),  # client 169.254.169.254
    ],
)
def test_ipv6_transition_addresses_are_judged_by_the_ipv4_they_carry(address: str, public: bool) -> None:
    assert is_public_address(address) is public


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[list[str]]]:
    """Answers for names under ``.test`` (RFC 2606: never real; no query leaves the machine), one
    list of addresses per lookup, in turn; the last answer stays. Other names resolve as usual."""
    answers: dict[str, list[list[str]]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        name = host.decode() if isinstance(host, bytes) else host  # anyio passes IDNA bytes
        if not (isinstance(name, str) and name.endswith(".test")):
            return real(host, port, *args, **kwargs)
        turns = answers.get(name) or [[]]
        infos: list[Any] = []
        for address in turns.pop(0) if len(turns) > 1 else turns[0]:
            if ":" in address:
                infos.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                infos.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        if not infos:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return infos

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


def test_every_resolved_address_is_checked_for_embedded_ipv4(fake_dns: dict[str, list[list[str]]]) -> None:
    """One transition address among public answers is enough to refuse the host (check_url only
    resolves: nothing is connected to)."""
    fake_dns["public.test"] = [["8.8.8.8", "2001:4860:4860::8888", "64:ff9b::808:808"]]
    asyncio.run(check_url("http://public.test/x.png", "images.0.url", []))
    for bad in ("64:ff9b::7f00:1", "2002:7f00:1::", "::127.0.0.1", "64:ff9b::a9fe:a9fe"):
        fake_dns["mixed.test"] = [["8.8.8.8", "2001:4860:4860::8888", bad]]
        with pytest.raises(ClipError) as info:
            asyncio.run(check_url("http://mixed.test/x.png", "images.0.url", []))
        assert info.value.code == ErrorCode.url_forbidden and info.value.field == "images.0.url", bad


class _WhereAmI(http.server.BaseHTTPRequestHandler):
    """Answers the address it was reached at, and lists (that address, the Host header) in ``hits``."""

    hits: list[tuple[str, str]] = []

    def do_GET(self) -> None:
        here = str(self.server.server_address[0])
        self.hits.append((here, self.headers["Host"]))
        body = here.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _where_am_i(address: str, port: int = 0, tls: ssl.SSLContext | None = None) -> Iterator[int]:
    """A ``_WhereAmI`` server on ``address`` (a loopback address); yields its port."""
    server = http.server.ThreadingHTTPServer((address, port), _WhereAmI)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _fetch(url: str, verify: ssl.SSLContext | bool = True) -> bytes:
    from service import images

    async def fetch() -> bytes:
        async with httpx.AsyncClient(trust_env=False, verify=verify) as client:
            return await images.fetch_url(client, url, "images.0.url", allowlist=[], max_bytes=1000, timeout_s=10)

    return asyncio.run(fetch())


def test_the_fetch_connects_to_the_address_that_was_checked(
    monkeypatch: pytest.MonkeyPatch, fake_dns: dict[str, list[list[str]]]
) -> None:
    """DNS rebinding: the name answers a public address to the check and an internal one after it.
    All on loopback: 127.0.0.2 and 127.0.0.4 stand for public addresses, 127.0.0.3 for the internal
    one the second answer points at."""
    from service import images

    monkeypatch.setattr(images, "is_public_address", lambda address: address in ("127.0.0.2", "127.0.0.4"))
    monkeypatch.setattr(_WhereAmI, "hits", [])
    with _where_am_i("127.0.0.2") as port, _where_am_i("127.0.0.3", port):
        fake_dns["rebind.test"] = [["127.0.0.2"], ["127.0.0.3"]]
        assert _fetch(f"http://rebind.test:{port}/img.png") == b"127.0.0.2"
        # An address that refuses the connection: the next checked one is tried, not a new lookup.
        fake_dns["rebind.test"] = [["127.0.0.4", "127.0.0.2"], ["127.0.0.3"]]
        assert _fetch(f"http://rebind.test:{port}/img.png") == b"127.0.0.2"
    assert _WhereAmI.hits == [("127.0.0.2", f"rebind.test:{port}")] * 2  # the URL's name still names the site


def test_a_fetch_by_address_still_checks_tls_against_the_url_name(
    monkeypatch: pytest.MonkeyPatch, fake_dns: dict[str, list[list[str]]], tmp_path: Path
) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not found (needed to make a certificate)")
    from service import images

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=site.test"]
        + ["-addext", "subjectAltName=DNS:site.test"],
        check=True,
        capture_output=True,
    )
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    monkeypatch.setattr(images, "is_public_address", lambda address: address == "127.0.0.2")
    monkeypatch.setattr(_WhereAmI, "hits", [])
    fake_dns["site.test"] = fake_dns["other.test"] = [["127.0.0.2"]]
    trust = ssl.create_default_context(cafile=str(cert))
    with _where_am_i("127.0.0.2", tls=server_tls) as port:
        assert _fetch(f"https://site.test:{port}/img.png", verify=trust) == b"127.0.0.2"
        # Same address, a name the certificate does not cover: refused, so the name is what is checked.
        with pytest.raises(ClipError, match="could not fetch"):
            _fetch(f"https://other.test:{port}/img.png", verify=trust)
    assert _WhereAmI.hits == [("127.0.0.2", f"site.test:{port}")]


# ----------------------------------------------------------------------------- over HTTP
class _Images(http.server.BaseHTTPRequestHandler):
    png = png_bytes(Image.new("RGB", (32, 32), (0, 200, 0)))
    slow_finished = 0
    slow_dropped = 0

    def do_GET(self) -> None:
        if self.path == "/img.png":
            self._send(200, self.png)
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/img.png")
            self.end_headers()
        elif self.path.startswith("/to?"):  # /to?url=...: a redirect to any URL
            self.send_response(302)
            self.send_header("Location", parse_qs(urlsplit(self.path).query)["url"][0])
            self.end_headers()
        elif self.path == "/big.png":
            self._send(200, b"\0" * 300_000)
        elif self.path.startswith("/80k.png"):  # under the per-image cap, ~80 KB each
            self._send(200, self.png + b"\0" * 80_000)
        elif self.path.startswith("/slow.png"):  # trickles for ~10 s unless the client goes away
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(100 * 500))
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b"\0" * 500)
                    self.wfile.flush()
                    time.sleep(0.1)
                _Images.slow_finished += 1
            except OSError:
                _Images.slow_dropped += 1
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def url_servers(serve_app: Any, tiny_store: Path) -> Iterator[tuple[str, str]]:
    common = {
        "store": str(tiny_store),
        "model": "tiny@production",
        "allow_url_images": True,
        "limits": {"max_image_bytes": 100_000, "max_url_bytes": 250_000},
        "url_timeout_s": 30,
    }
    with serve_app(**common) as guarded, serve_app(**common, url_allowlist=["127.0.0.1"]) as allowed:
        yield guarded.url, allowed.url


def embed(url: str, image: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{url}/embed", json={"images": [image]}, timeout=30)


def test_loopback_url_refused_without_allowlist(url_servers: tuple[str, str], image_host: str) -> None:
    guarded, _ = url_servers
    r = embed(guarded, {"url": f"{image_host}/img.png"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "url_forbidden"
    assert r.json()["error"]["field"] == "images.0.url"
    for url in ("file:///etc/passwd", "ftp://127.0.0.1/x", "http://user:pw@example.com/x.png", "gopher://x"):
        r = embed(guarded, {"url": url})
        assert r.status_code == 400 and r.json()["error"]["code"] == "url_forbidden", url


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every HTTP client connection this process opens is listed, and one to anything but a
    loopback address fails before any socket is opened. The service runs in this process, and its
    URL fetches go through httpcore's network backend whatever event loop uvicorn picked (uvloop
    connects in C, out of reach of a patched ``socket``)."""
    attempts: list[tuple[str, int]] = []
    real = httpcore.AnyIOBackend.connect_tcp

    async def connect_tcp(self: httpcore.AnyIOBackend, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        try:
            loopback = ipaddress.ip_address(host.strip("[]").split("%", 1)[0]).is_loopback
        except ValueError:  # a name: only "localhost" is known to stay here
            loopback = host == "localhost"
        attempts.append((host, port))
        if not loopback:
            raise httpcore.ConnectError(f"tests connect to loopback only, not {host}")
        return await real(self, host, port, *args, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", connect_tcp)
    return attempts


@pytest.mark.parametrize("host", ["[64:ff9b::7f00:1]", "[2002:7f00:1::]", "[::127.0.0.1]", "[64:ff9b:1::7f00:1]"])
def test_transition_addresses_are_refused_directly_and_after_a_redirect(
    url_servers: tuple[str, str], image_host: str, loopback_only: list[tuple[str, int]], host: str
) -> None:
    guarded, allowed = url_servers
    target = f"http://{host}:{urlsplit(image_host).port}/img.png"
    direct = embed(guarded, {"url": target})
    assert direct.status_code == 400 and direct.json()["error"]["code"] == "url_forbidden", direct.text
    # 127.0.0.1 is allowlisted on this server; the hop it redirects to is checked on its own.
    hop = embed(allowed, {"url": f"{image_host}/to?url={target}"})
    assert hop.status_code == 400 and hop.json()["error"]["code"] == "url_forbidden", hop.text
    assert hop.json()["error"]["field"] == "images.0.url"
    # The tripwire saw the first hop (so it is on the fetch path) and nothing else.
    assert loopback_only == [("127.0.0.1", urlsplit(image_host).port)], "the service tried to connect first"


def test_allowlisted_url_is_fetched(url_servers: tuple[str, str], image_host: str) -> None:
    _, allowed = url_servers
    direct = embed(allowed, {"url": f"{image_host}/img.png"})
    assert direct.status_code == 200, direct.text
    data = {"data": base64.b64encode(_Images.png).decode()}
    assert embed(allowed, data).json()["ids"] == direct.json()["ids"]
    assert embed(allowed, {"url": f"{image_host}/redirect"}).json()["ids"] == direct.json()["ids"]
    missing = embed(allowed, {"url": f"{image_host}/missing.png"})
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "bad_image"
    big = embed(allowed, {"url": f"{image_host}/big.png"})
    assert big.status_code == 413


def test_large_and_wrapped_data_answer_like_the_same_bytes_by_url(
    url_servers: tuple[str, str], image_host: str
) -> None:
    """Long base64 strings are decoded in the decode pool, short ones on the event loop: same answers."""
    _, allowed = url_servers
    padded = httpx.get(f"{image_host}/80k.png", timeout=30).content  # a PNG followed by 80 KB of padding
    plain = base64.b64encode(padded).decode()
    assert len(plain) > INLINE_BASE64_CHARS
    by_url = embed(allowed, {"url": f"{image_host}/80k.png"})
    assert by_url.status_code == 200, by_url.text
    for data in (plain, base64.encodebytes(padded).decode()):
        got = embed(allowed, {"data": data})
        assert got.status_code == 200, got.text
        assert got.json()["ids"] == by_url.json()["ids"] and got.json()["embeddings"] == by_url.json()["embeddings"]


def test_the_urls_of_one_request_share_a_byte_budget(url_servers: tuple[str, str], image_host: str) -> None:
    _, allowed = url_servers
    three = [{"url": f"{image_host}/80k.png?{i}"} for i in range(3)]  # 3 x 80 KB: within 250 KB
    assert httpx.post(f"{allowed}/embed", json={"images": three}, timeout=30).status_code == 200
    four = [{"url": f"{image_host}/80k.png?{i}"} for i in range(4)]  # 4 x 80 KB: over
    r = httpx.post(f"{allowed}/embed", json={"images": four}, timeout=30)
    assert r.status_code == 413 and "250000 bytes in all" in r.json()["error"]["message"]


def test_a_failed_fetch_cancels_its_siblings(url_servers: tuple[str, str], image_host: str) -> None:
    _, allowed = url_servers
    before = _Images.slow_dropped
    images = [{"url": f"{image_host}/slow.png?{i}"} for i in range(3)] + [{"url": f"{image_host}/missing.png"}]
    r = httpx.post(f"{allowed}/embed", json={"images": images}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["field"] == "images.3.url"
    deadline = time.monotonic() + 20
    while _Images.slow_dropped < before + 3:  # the server sees each slow download abandoned
        assert time.monotonic() < deadline, "the sibling downloads went on"
        time.sleep(0.05)
    assert _Images.slow_finished == 0


class _CountingServer(http.server.ThreadingHTTPServer):
    """Serves ``/<i>.png``, a distinct picture per ``i``, each after a short pause, and records the
    most connections it held at once."""

    daemon_threads = True
    request_queue_size = 128  # let every connection in at once: the client, not the backlog, must limit them

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CountingHandler)
        self.lock = threading.Lock()
        self.open = self.most = self.served = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _CountingHandler(http.server.BaseHTTPRequestHandler):
    server: _CountingServer

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.open += 1
            self.server.most = max(self.server.most, self.server.open)

    def do_GET(self) -> None:
        time.sleep(0.1)  # long enough for the fetches the client lets through to overlap
        i = int(self.path.strip("/").removesuffix(".png"))
        body = png_bytes(Image.new("RGB", (32, 32), (4 * i % 256, 255 - 4 * i % 256, 128)))
        with self.server.lock:
            # Counted out before the answer goes: once the client has it, it may connect again.
            self.server.open -= 1
            self.server.served += 1
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def counting_host() -> Iterator[_CountingServer]:
    server = _CountingServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_the_urls_of_one_request_are_fetched_a_few_at_a_time(
    url_servers: tuple[str, str], counting_host: _CountingServer
) -> None:
    _, allowed = url_servers  # default settings: 4 fetches at a time per request
    images = [{"url": f"{counting_host.url}/{i}.png"} for i in range(64)]
    r = httpx.post(f"{allowed}/embed", json={"images": images}, timeout=60)
    assert r.status_code == 200, r.text
    assert len(set(r.json()["ids"])) == 64 and counting_host.served == 64  # every image arrived, none refused
    assert 1 <= counting_host.most <= 4, f"{counting_host.most} connections at once"


def test_the_url_fetches_of_all_requests_share_a_cap(
    serve_app: Any, tiny_store: Path, counting_host: _CountingServer
) -> None:
    settings = {
        "store": str(tiny_store),
        "model": "tiny@production",
        "allow_url_images": True,
        "url_allowlist": ["127.0.0.1"],
        "url_fetches_per_request": 4,
        "url_fetches_per_process": 6,
    }

    async def requests(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            bodies = [
                {"images": [{"url": f"{counting_host.url}/{10 * n + i}.png"} for i in range(8)]} for n in range(3)
            ]
            return list(await asyncio.gather(*(client.post(f"{url}/embed", json=b) for b in bodies)))

    with serve_app(**settings) as running:
        answers = asyncio.run(requests(running.url))
    assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
    assert counting_host.served == 24  # 3 requests x 4 at a time would be 12 at once
    assert 1 <= counting_host.most <= 6, f"{counting_host.most} connections at once"


def test_a_huge_transparent_image_is_reduced_before_its_alpha_is_flattened(monkeypatch: pytest.MonkeyPatch) -> None:
    from service import images

    big = Image.new("RGBA", (4000, 3000), (255, 0, 0, 0))
    big.paste((0, 0, 255, 255), (1000, 1000, 3000, 2000))
    data = png_bytes(big)
    composited: list[tuple[int, int]] = []
    real = Image.alpha_composite
    monkeypatch.setattr(Image, "alpha_composite", lambda a, b: composited.append(b.size) or real(a, b))
    out = images.decode_image(data, "image", 40_000_000, min_side=64)
    assert composited == [out.size] and min(out.size) >= 128 and max(out.size) < 1000  # reduced first
    assert out.getpixel((out.width // 2, out.height // 2)) == (0, 0, 255)
    assert out.getpixel((2, 2)) == (255, 255, 255)  # transparent flattened on white


@pytest.mark.parametrize("mode", ["RGBA", "P", "LA", "RGB", "1"])
def test_images_near_the_model_size_decode_exactly_as_before(mode: str) -> None:
    from service import images

    rng = np.random.default_rng(0)
    base = Image.fromarray(rng.integers(0, 256, (250, 300, 4), dtype=np.uint8), "RGBA")
    image = base if mode == "RGBA" else base.convert(mode)
    if mode == "P":
        image.info["transparency"] = 0
    data = png_bytes(image)
    reference = images.to_rgb(Image.open(io.BytesIO(data)))  # a full decode, then flattening
    out = images.decode_image(data, "image", 40_000_000, min_side=64)  # 250 < 4 x 64: no reduction
    assert np.array_equal(np.asarray(out), np.asarray(reference))
    large = image.resize((1200, 1000))
    shrunk = images.decode_image(png_bytes(large), "image", 40_000_000, min_side=64)
    assert shrunk.mode == "RGB" and min(shrunk.size) >= 128
