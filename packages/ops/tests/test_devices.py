"""Devices: third-party devices through a real ``opstrata.devices`` entry point, and thread safety."""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest

import opstrata.ops as ops
from opstrata.ops.testing import write_fake_distribution

PLUGIN = """
import numpy as np
import opstrata.ops as ops

LOADS = []

def register_kernels():
    LOADS.append(1)
    ops.register("_test_scale", device="fakedev", dtypes=[np.float32])(lambda x, *, k=2: x * k)
    ops.register("_test_scale", device="ref")(lambda x, *, k=2: x * k)
"""

CHECK = """
import json, numpy as np, opstrata.ops as ops
import fakedev_pkg
out = {"devices": ops.list_devices()}
ops.set_fallback_policy("allow")
out["native"] = ops.call("_test_scale", np.ones(2, np.float32), device="fakedev", k=3).tolist()
out["path64"] = ops.dispatch_path("_test_scale", "fakedev", "float64")
ops.call("_test_scale", np.ones(2), device="fakedev")
with ops.device("fakedev"):
    ops.call("_test_scale", np.ones(2, np.float32))
out["report"] = [(r.op, r.device, r.path, r.dtype, r.count) for r in ops.fallback_report().records]
out["loads"] = len(fakedev_pkg.LOADS)
print(json.dumps(out))
"""


def _plugin_site(tmp_path, target: str, body: str = PLUGIN):
    pkg = tmp_path / "fakedev_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    write_fake_distribution(
        tmp_path, "fakedev", "0.1", entry_points={"opstrata.devices": {"fakedev": target}}
    )
    assert (tmp_path / "fakedev-0.1.dist-info" / "entry_points.txt").is_file()
    return [str(tmp_path)]


def test_entry_point_device_is_found_and_dispatched(tmp_path, run_python):
    proc = run_python(CHECK, path=_plugin_site(tmp_path, "fakedev_pkg:register_kernels"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["devices"] == ["cpu", "fakedev", "ref"]
    assert out["native"] == [3.0, 3.0]
    assert out["path64"] == "device:ref"  # fakedev's default chain is cpu -> ref; cpu has none
    assert out["report"] == [["_test_scale", "fakedev", "device:ref", "float64", 1]]
    assert out["loads"] == 1  # loaded lazily, once


def test_entry_point_may_be_a_module(tmp_path, run_python):
    site = _plugin_site(tmp_path, "fakedev_pkg", body=PLUGIN + "\nregister_kernels()  # on import\n")
    proc = run_python(CHECK, path=site)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["native"] == [3.0, 3.0] and out["loads"] == 1


def test_broken_plugin_names_its_entry_point(tmp_path, run_python):
    site = _plugin_site(tmp_path, "fakedev_pkg:missing_function")
    code = "import numpy as np, opstrata.ops as ops\nops.call('_test_x', np.ones(1))"
    proc = run_python(code, path=site)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("opstrata.ops._errors.DevicePluginError: device plugin 'fakedev' failed to load")
    assert "fakedev = fakedev_pkg:missing_function" in last and "fakedev 0.1" in last
    assert "OPSTRATA_SKIP_DEVICES=fakedev" in last
    ok = run_python(
        "import opstrata.ops as ops; print(ops.list_devices())",
        path=site,
        env={"OPSTRATA_SKIP_DEVICES": "fakedev"},
    )
    assert ok.returncode == 0 and ok.stdout.strip() == "['cpu', 'ref']"


def _device_probe():
    ops.register("_test_where", device="ref")(lambda x: "ref")
    ops.register("_test_where", device="cpu")(lambda x: "cpu")


def test_device_context_is_per_thread():
    _device_probe()
    barrier = threading.Barrier(4)
    errors: list[str] = []

    def worker(dev: str) -> None:
        with ops.device(dev):
            barrier.wait()  # all four threads hold their context at once
            for _ in range(200):
                got = ops.call("_test_where", 1.0)
                if got != dev:
                    errors.append(f"{dev} thread ran on {got}")

    threads = [threading.Thread(target=worker, args=(d,)) for d in ("ref", "cpu", "ref", "cpu")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_new_thread_sees_process_default_not_callers_context():
    _device_probe()
    seen = []
    with ops.device("ref"):
        t = threading.Thread(target=lambda: seen.append(ops.call("_test_where", 1.0)))
        t.start()
        t.join()
        assert ops.call("_test_where", 1.0) == "ref"
    assert seen == ["cpu"]


def test_device_context_is_per_asyncio_task():
    _device_probe()

    async def task(dev: str) -> list[str]:
        with ops.device(dev):
            out = []
            for _ in range(5):
                await asyncio.sleep(0)
                out.append(ops.call("_test_where", 1.0))
            return out

    async def main():
        return await asyncio.gather(task("ref"), task("cpu"))

    assert asyncio.run(main()) == [["ref"] * 5, ["cpu"] * 5]


def test_context_restores_after_error():
    _device_probe()
    with pytest.raises(RuntimeError), ops.device("ref"):
        raise RuntimeError("boom")
    assert ops.get_default_device() == "cpu"
    assert ops.call("_test_where", np.ones(1)) == "cpu"


def test_chains():
    assert ops.get_fallback_chain("cpu") == ("ref",)
    assert ops.get_fallback_chain("ref") == ()
    assert ops.get_fallback_chain("newdev") == ("cpu", "ref")


def test_device_list_follows_registrations() -> None:
    """ops.device() validates against the devices with kernels, recomputed after each registry change."""
    with pytest.raises(ops.UnknownDeviceError):
        with ops.device("blinkdev"):
            pass
    ops.register("blink_op", device="blinkdev")(lambda x: x)
    try:
        with ops.device("blinkdev"):
            assert ops.get_default_device() == "blinkdev"
        assert "blinkdev" in ops.list_devices()
    finally:
        ops.unregister("blink_op")
    with pytest.raises(ops.UnknownDeviceError):
        with ops.device("blinkdev"):
            pass
