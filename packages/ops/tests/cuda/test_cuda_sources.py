"""The cuda device's CUDA source compiles with NVRTC (no GPU needed) and its Python launch helpers agree.

NVRTC comes from the `nvidia-cuda-nvrtc` wheel (or a CUDA toolkit on the library path); without it the
compile tests skip, unless OPSTRATA_REQUIRE_NVRTC=1 (the `cuda_sources` nox session) makes them fail.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from opstrata.ops._cuda import _sources as src

_MISSING = "NVRTC not installed (pip install nvidia-cuda-nvrtc)"


def _candidates() -> list[str]:
    """libnvrtc paths: the `nvidia` namespace package (cu13, then the cu12 layout), then the library path."""
    found: list[str] = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        for sub in ("cu13/lib", "cuda_nvrtc/lib"):
            found += sorted(glob.glob(os.path.join(root, sub, "libnvrtc.so*")), reverse=True)
    system = ctypes.util.find_library("nvrtc")
    if system:
        found.append(system)
    # the builtins library is a dependency, not the API
    return [p for p in found if "builtins" not in os.path.basename(p)]


def _load_nvrtc() -> ctypes.CDLL | None:
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(lib, "nvrtcCreateProgram"):
            return lib
    return None


@pytest.fixture(scope="module")
def nvrtc() -> ctypes.CDLL:
    lib = _load_nvrtc()
    if lib is None:
        if os.environ.get("OPSTRATA_REQUIRE_NVRTC") == "1":
            pytest.fail(_MISSING + " and OPSTRATA_REQUIRE_NVRTC=1", pytrace=False)
        pytest.skip(_MISSING)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def _compile(lib: ctypes.CDLL, source: str, options: tuple[str, ...]) -> tuple[int, str, str]:
    """(nvrtcResult of the compile, program log, PTX or "") of `source` under `options`."""

    def check(result: int, what: str) -> None:
        assert result == 0, f"{what}: {lib.nvrtcGetErrorString(result).decode()}"

    prog = ctypes.c_void_p()
    check(
        lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"opstrata_cuda.cu", 0, None, None),
        "nvrtcCreateProgram",
    )
    try:
        opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        result = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        log = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        ptx = ""
        if result == 0:
            check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
            buf = ctypes.create_string_buffer(size.value)
            check(lib.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
            ptx = buf.value.decode()
            check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            assert size.value > 0 or "--gpu-architecture=sm_" not in " ".join(options), (
                "no CUBIN: ptxas did not run"
            )
        return result, log.value.decode(errors="replace"), ptx
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


ARCHS = ("sm_80", "sm_90")


@pytest.fixture(scope="module")
def compiled(nvrtc: ctypes.CDLL) -> dict[str, tuple[str, str]]:
    """arch -> (PTX, log) of SOURCE, compiled concurrently (NVRTC releases the GIL; a compile takes seconds).

    A real arch (sm_XX) makes NVRTC run ptxas too, so the inline PTX (mma.sync, cvt) is assembled here;
    ``-v`` adds ptxas's resource report to the log.
    """

    def build(arch: str) -> tuple[str, str]:
        options = (*src.compile_options(arch), "--ptxas-options=-v")
        result, log, text = _compile(nvrtc, src.SOURCE, options)
        assert result == 0, f"NVRTC failed for {arch} ({nvrtc.nvrtcGetErrorString(result).decode()}):\n{log}"
        return text, log

    with ThreadPoolExecutor(max_workers=len(ARCHS)) as pool:
        return dict(zip(ARCHS, pool.map(build, ARCHS), strict=True))


@pytest.fixture(params=ARCHS)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def ptx(arch: str, compiled: dict[str, tuple[str, str]]) -> str:
    return compiled[arch][0]


def _ptxas_shared(log: str) -> dict[str, int]:
    """kernel -> static shared bytes, from ptxas -v's report ("Compiling entry function 'X'", then "Used ...")."""
    out: dict[str, int] = {}
    entry = None
    for line in log.splitlines():
        found = re.search(r"Compiling entry function '(\w+)'", line)
        if found:
            entry = found.group(1)
        elif entry and "Used" in line and "registers" in line:
            smem = re.search(r"(\d+) bytes smem", line)
            out[entry] = int(smem.group(1)) if smem else 0
            entry = None
    return out


def test_every_kernel_is_an_entry(ptx: str) -> None:
    for name in src.KERNEL_NAMES:
        assert re.search(rf"\.entry\s+{name}\s*\(", ptx), f"{name} is not an .entry of the PTX"
    entries = set(re.findall(r"\.visible\s+\.entry\s+(\w+)\s*\(", ptx))
    assert entries == set(src.KERNEL_NAMES), f"unlisted: {entries - set(src.KERNEL_NAMES)}"


def test_mma_kernels_use_tensor_cores(ptx: str) -> None:
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx


def test_ieee_math_and_static_shared_memory(ptx: str) -> None:
    # expf / tanhf use ex2.approx and rcp.approx inside their accurate (libdevice) expansions; fast math
    # shows as approximate division or square root
    for fast in ("div.approx", "div.full", "sqrt.approx", "rsqrt.approx"):
        assert fast not in ptx, f"fast math leaked in ({fast}): expected IEEE division and sqrt"
    assert "div.rn.f32" in ptx and "sqrt.rn.f32" in ptx
    for name in src.KERNEL_NAMES:
        body = ptx.split(f".entry {name}(", 1)[1].split(".entry ", 1)[0]
        assert ".extern .shared" not in body, f"{name} declares dynamic shared memory; flash_launch says 0"


def test_ptxas_shared_memory_matches_the_launch_helpers(
    arch: str, compiled: dict[str, tuple[str, str]]
) -> None:
    shared = _ptxas_shared(compiled[arch][1])
    assert set(shared) == set(src.KERNEL_NAMES), f"ptxas reported {sorted(shared)}"
    for dim in src.FLASH_HEAD_DIMS:
        for dtype in src.DTYPE_SUFFIX:
            name = src.kernel_name("flash_attn", dtype, dim)
            assert shared[name] == src.flash_static_shared_bytes(dim), name
        for dtype in src.FLASH_MMA_DTYPES:
            name = src.kernel_name("flash_attn_mma", dtype, dim)
            assert shared[name] == src.flash_static_shared_bytes(dim, mma=True), name
    assert max(shared.values()) <= 48 * 1024


def test_a_compile_error_reports_the_log(nvrtc: ctypes.CDLL) -> None:
    result, log, _ = _compile(
        nvrtc, 'extern "C" __global__ void broken() { undeclared_name(); }', ("-std=c++17",)
    )
    assert result != 0 and "undeclared_name" in log


def test_source_is_header_free_and_names_match() -> None:
    assert "#include" not in src.SOURCE
    declared = re.findall(r"opstrata_\w+_##SFX(?:##_d##D)?", src.SOURCE)
    assert declared, "expected the extern C names to be built by the instantiation macros"
    assert len(set(src.KERNEL_NAMES)) == len(src.KERNEL_NAMES) == 4 * 3 + 2 * 3 + 2 * 2
    assert src.compile_options("sm_90") == ("-std=c++17", "--gpu-architecture=sm_90")
    assert not any("fast_math" in o for o in src.compile_options("sm_80"))


@pytest.mark.parametrize("dtype", sorted(src.DTYPE_SUFFIX))
def test_kernel_name(dtype: str) -> None:
    sfx = src.DTYPE_SUFFIX[dtype]
    assert src.kernel_name("softmax", dtype) == f"opstrata_softmax_rows_{sfx}"
    assert src.kernel_name("layer_norm", dtype) == f"opstrata_layer_norm_rows_{sfx}"
    assert src.kernel_name("rms_norm", dtype) == f"opstrata_rms_norm_rows_{sfx}"
    assert src.kernel_name("bias_act", dtype) == f"opstrata_bias_act_{sfx}"
    for dim in src.FLASH_HEAD_DIMS:
        assert src.kernel_name("flash_attn", dtype, dim) == f"opstrata_flash_attn_{sfx}_d{dim}"
        if dtype in src.FLASH_MMA_DTYPES:
            assert src.kernel_name("flash_attn_mma", dtype, dim) == f"opstrata_flash_attn_mma_{sfx}_d{dim}"
        else:
            with pytest.raises(ValueError, match="float16"):
                src.kernel_name("flash_attn_mma", dtype, dim)
    for kind in src.KINDS:
        dim = src.FLASH_HEAD_DIMS[0] if kind.startswith("flash") else None
        if kind != "flash_attn_mma" or dtype in src.FLASH_MMA_DTYPES:
            assert src.kernel_name(kind, dtype, dim) in src.KERNEL_NAMES


def test_kernel_name_rejects() -> None:
    with pytest.raises(ValueError, match="float32, float16, bfloat16"):
        src.kernel_name("softmax", "float64")
    with pytest.raises(ValueError, match=r"head_dim in \(64, 128\)"):
        src.kernel_name("flash_attn", "float16", 96)
    with pytest.raises(ValueError, match="head_dim"):
        src.kernel_name("flash_attn", "float16")
    with pytest.raises(ValueError, match="takes no head_dim"):
        src.kernel_name("softmax", "float16", 64)
    with pytest.raises(ValueError, match="softmax, layer_norm"):
        src.kernel_name("matmul", "float16")


@pytest.mark.parametrize("launch", [src.flash_launch, src.flash_launch_mma])
@pytest.mark.parametrize("head_dim", src.FLASH_HEAD_DIMS)
@pytest.mark.parametrize(("b", "h", "n"), [(1, 1, 1), (2, 3, 17), (4, 32, 4096), (1, 8, 65), (3, 5, 1000)])
def test_flash_launch(launch, head_dim: int, b: int, h: int, n: int) -> None:
    mma = launch is src.flash_launch_mma
    block_m = src.FLASH_MMA_BLOCK_M if mma else src.FLASH_BLOCK_M[head_dim]
    threads = src.FLASH_MMA_THREADS if mma else src.FLASH_THREADS
    for kind_dtype in (
        "float16",
        src.kernel_name("flash_attn_mma" if mma else "flash_attn", "bfloat16", head_dim),
    ):
        grid, block, shared = launch(kind_dtype, b, h, n, head_dim)
        tiles = -(-n // block_m)
        assert grid == (tiles * b * h, 1, 1)  # one block per (b, h, query tile)
        assert tiles * block_m >= n > (tiles - 1) * block_m
        assert block == (threads, 1, 1) and block_m % (threads // 32) == 0
        assert shared == 0  # all static
    static = src.flash_static_shared_bytes(head_dim, mma=mma)
    assert static <= 48 * 1024 <= 227 * 1024


def test_flash_launch_rejects() -> None:
    with pytest.raises(ValueError, match="head_dim"):
        src.flash_launch("float32", 1, 1, 8, 96)
    with pytest.raises(ValueError, match="float16, bfloat16"):
        src.flash_launch_mma("float32", 1, 1, 8, 64)
    with pytest.raises(ValueError, match="dtype name"):
        src.flash_launch("float64", 1, 1, 8, 64)
    with pytest.raises(ValueError, match=">= 1"):
        src.flash_launch("float16", 0, 1, 8, 64)


def test_elementwise_launch() -> None:
    assert src.elementwise_launch(1) == ((1, 1, 1), (src.ELEMENTWISE_THREADS, 1, 1))
    assert src.elementwise_launch(0)[0] == (1, 1, 1)
    assert src.elementwise_launch(10**12)[0] == (src.ELEMENTWISE_MAX_BLOCKS, 1, 1)
