"""The cuda device's probe and registration, on a machine without a GPU (CI's): every absence is named.

The probe is fed stand-in CuPy modules (absent, broken, no GPU, one GPU); registration on a machine
without CuPy marks ``cuda`` unavailable, and a call asking for it raises with the reason.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import opstrata.ops as ops
from opstrata.ops import _cuda
from opstrata.ops._cuda import _probe


def _importer(module):
    def imp(name):
        assert name == "cupy"
        if isinstance(module, BaseException):
            raise module
        return module

    return imp


def _fake_cupy(count=1, error=None, props=None):
    def get_count():
        if error is not None:
            raise error
        return count

    runtime = types.SimpleNamespace(
        getDeviceCount=get_count,
        getDeviceProperties=lambda i: (
            props or {"name": b"NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "totalGlobalMem": 85 * 2**30}
        ),
        runtimeGetVersion=lambda: 13000,
    )
    return types.SimpleNamespace(__version__="14.2.0", cuda=types.SimpleNamespace(runtime=runtime))


def test_absent_cupy_names_the_install(monkeypatch):
    monkeypatch.delenv(_probe.DISABLE_ENV, raising=False)
    st = _probe.probe(_importer(ImportError("No module named 'cupy'")))
    assert not st.available and "CuPy is not installed" in st.reason and "opstrata-ops[cuda]" in st.reason
    assert st.summary().startswith("cuda: not available: CuPy is not installed")


def test_broken_cupy_says_what_it_raised(monkeypatch):
    monkeypatch.delenv(_probe.DISABLE_ENV, raising=False)
    st = _probe.probe(_importer(OSError("libcudart.so.13: cannot open shared object file")))
    assert not st.available and "OSError: libcudart.so.13" in st.reason


def test_no_driver_or_no_gpu(monkeypatch):
    monkeypatch.delenv(_probe.DISABLE_ENV, raising=False)
    err = RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
    st = _probe.probe(_importer(_fake_cupy(error=err)))
    assert not st.available and "no usable GPU" in st.reason and "cudaErrorNoDevice" in st.reason
    assert st.cupy_version == "14.2.0"
    st0 = _probe.probe(_importer(_fake_cupy(count=0)))
    assert not st0.available and "sees 0 GPUs" in st0.reason


def test_visible_gpu_is_described(monkeypatch):
    monkeypatch.delenv(_probe.DISABLE_ENV, raising=False)
    st = _probe.probe(_importer(_fake_cupy()))
    assert st.available and st.reason == ""
    assert (st.device_name, st.compute_capability, st.cuda_runtime) == (
        "NVIDIA H100 80GB HBM3",
        "9.0",
        "13.0",
    )
    assert st.summary() == "cuda: NVIDIA H100 80GB HBM3 (sm_90, 85.0 GiB), CuPy 14.2.0, CUDA runtime 13.0"


def test_disable_env_wins(monkeypatch):
    monkeypatch.setenv(_probe.DISABLE_ENV, "1")
    st = _probe.probe(_importer(_fake_cupy()))
    assert not st.available and "OPSTRATA_DISABLE_CUDA=1" in st.reason


def test_register_kernels_marks_cuda_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setattr(_cuda, "cuda_status", lambda: _probe.CudaStatus(False, "no GPU in this test"))
    _cuda.register_kernels()
    with pytest.raises(ops.DeviceUnavailableError, match="'cuda' is not available here: no GPU in this test"):
        ops.relu(np.ones(2, np.float32), device="cuda")
    row = {s.name: s for s in ops.device_status()}["cuda"]
    assert not row.available and row.reason == "no GPU in this test"


@pytest.mark.skipif(_cuda.cuda_status().available, reason="a GPU is visible: the absent path does not apply")
def test_this_machine_reports_cuda_absent_through_the_entry_point():
    """ops' own entry point ran on the first dispatch and left the reason (not an unknown device)."""
    rows = {s.name: s for s in ops.device_status()}
    assert "cuda" in rows and not rows["cuda"].available and rows["cuda"].reason
    assert "cuda" not in ops.list_devices()
