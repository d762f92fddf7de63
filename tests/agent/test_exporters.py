"""Vendor exporter collectors against a real HTTP server serving recorded metric text.

The recordings (tests/agent/data/exporters/<vendor>.prom) follow each exporter's metric
names, labels and units as protocols.md section 7 documents them; vendors marked there as
secondary-source only (Hygon's metric name, MetaX, Moore Threads' mtgpu, Kunlunxin labels)
are recorded from those sources and say so in their adapter module.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotgpu.adapters.agent_metrics import AgentMetrics
from spotgpu.adapters.exporters import VENDOR_MODULES, adapter, load_adapters
from spotgpu.adapters.exporters.scrape import Exporter, ExporterUtilization, convert_text
from spotgpu.core.ids import DeviceID
from spotgpu.ports.node import GpuDevice

DATA = Path(__file__).parent / "data" / "exporters"


class _Handler(BaseHTTPRequestHandler):
    pages: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        body = self.pages.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, dict[str, bytes]]]:
    pages: dict[str, bytes] = {f"/{p.stem}": p.read_bytes() for p in DATA.glob("*.prom")}
    handler = type("Handler", (_Handler,), {"pages": pages})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", pages
    finally:
        httpd.shutdown()
        httpd.server_close()


def dev(ident: str, index: int, uuid: str | None = None) -> GpuDevice:
    return GpuDevice(DeviceID(ident), index, uuid or ident)


CASES = {
    "dcgm": (
        [dev("GPU-00000000-0000-4000-8000-000000000000", 0), dev("GPU-00000001-0000-4000-8000-000000000001", 1)],
        [87.0, 0.0],
    ),
    "ascend": ([dev("npu0", 0, "x"), dev("npu1", 1, "y")], [64.0, 0.0]),
    "cambricon": (
        [dev("MLU-20001012-1916-0000-0000-000000000000", 7), dev("MLU-20001012-1916-0000-0000-000000000001", 8)],
        [55.5, 0.0],
    ),
    "amd": ([dev("amd0", 0), dev("amd1", 1)], [42.0, 0.0]),
    "intel-xpu": (
        [
            dev("card0", 0, "01000000-0000-0000-0000-000000290000"),
            dev("card1", 1, "01000000-0000-0000-0000-0000003a0000"),
        ],
        [74.0, 0.0],
    ),
    "iluvatar": ([dev("GPU-e1f10d8a-0d8e-5d4f-b1f2-000000000000", 0), dev("iv1", 1, "nope")], [12.0, 0.0]),
    "enflame": ([dev("gcu0", 0), dev("gcu1", 1), dev("gcu2", 2)], [9.0, 0.0, None]),
    "hygon": ([dev("T8R5C1030101", 5), dev("dcu1", 1)], [77.0, 0.0]),
    "metax": (
        [dev("GPU-8a9f3c1d-0000-0000-0000-000000000000", 0), dev("GPU-8a9f3c1d-0000-0000-0000-000000000001", 1)],
        [23.0, 0.0],
    ),
    "mthreads": ([dev("GPU-1a2b3c4d-0000-0000-0000-000000000000", 0), dev("mt1", 1)], [5.0, 0.0]),
    "kunlunxin": ([dev("XPU-00000000", 0), dev("xpu1", 1)], [18.0, 0.0]),
}


def test_every_vendor_is_registered_and_recorded() -> None:
    names = load_adapters()
    assert len(VENDOR_MODULES) == 11
    assert set(names) == set(CASES) == {p.stem for p in DATA.glob("*.prom")}


@pytest.mark.parametrize("vendor", sorted(CASES))
def test_vendor_utilization_over_http(vendor: str, server: tuple[str, dict[str, bytes]]) -> None:
    base, _ = server
    devices, expected = CASES[vendor]
    metrics = AgentMetrics()
    reader = ExporterUtilization([Exporter(vendor, f"{base}/{vendor}")], on_error=metrics.collector_error)
    values = reader.read(devices)
    assert [values[d.id] for d in devices] == expected
    if vendor == "enflame":
        assert [k for _, k, _ in reader.last_errors] == ["unsupported", "unmatched"]
        assert metrics.sample("spotgpu_agent_collector_errors_total", {"source": "enflame", "kind": "unsupported"}) == 1
    else:
        assert reader.last_errors == []


def test_ratio_metric_is_normalised_to_percent() -> None:
    text = (DATA / "dcgm.prom").read_text()
    only_prof = "\n".join(line for line in text.splitlines() if "GPU_UTIL" not in line and "SM_CLOCK" not in line)
    result = convert_text(adapter("dcgm"), only_prof + "\n")
    assert result.metric == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    assert sorted(round(v, 4) for v in result.utilization.values()) == [0.0, 87.1234]


def test_errors_are_counted_never_raised(server: tuple[str, dict[str, bytes]]) -> None:
    base, pages = server
    pages["/odd"] = (
        b"# TYPE ix_gpu_utilization gauge\n"
        b'ix_gpu_utilization{gpu="0"} NaN\n'
        b'ix_gpu_utilization{gpu="1"} 250\n'
        b'ix_gpu_utilization{name="no device label"} 5\n'
        b'ix_gpu_utilization{gpu="2"} 100\n'
    )
    pages["/garbage"] = b"this is {not prometheus text\n"
    metrics = AgentMetrics()
    devices = [dev("a", 0), dev("b", 1), dev("c", 2), dev("d", 3)]
    reader = ExporterUtilization(
        [
            Exporter("iluvatar", f"{base}/odd"),
            Exporter("amd", f"{base}/dcgm"),  # wrong vendor: no series of its metric
            Exporter("dcgm", f"{base}/garbage"),
            Exporter("cambricon", f"{base}/missing-page"),
            Exporter("metax", "http://127.0.0.1:9/metrics", timeout=0.5),
        ],
        on_error=metrics.collector_error,
    )
    values = reader.read(devices)
    assert values == {"a": None, "b": None, "c": 100.0, "d": None}
    kinds = sorted({(s, k) for s, k, _ in reader.last_errors})
    assert kinds == [
        ("amd", "missing_metric"),
        ("cambricon", "scrape"),
        ("dcgm", "parse"),
        ("iluvatar", "bad_value"),
        ("iluvatar", "no_device_label"),
        ("iluvatar", "unmatched"),
        ("metax", "scrape"),
    ]
    assert metrics.sample("spotgpu_agent_collector_errors_total", {"source": "iluvatar", "kind": "bad_value"}) == 2


@given(st.text(max_size=300))
def test_arbitrary_text_never_crashes_the_reader_conversion(text: str) -> None:
    for name in ("dcgm", "enflame", "intel-xpu"):
        try:
            result = convert_text(adapter(name), text)
        except Exception:
            continue  # the reader counts these as 'parse' errors
        assert all(0.0 <= v <= 100.0 for v in result.utilization.values())
