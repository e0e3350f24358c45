"""Device fingerprints: what an engine artifact was built for, and what we run on now.

An artifact built for one GPU (name, compute capability), driver or CUDA version, or one CPU
ISA, is not loaded on another: the cache key includes the fingerprint and loading checks it.
cuda-python is imported lazily (CPU-only machines never import it).
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from pathlib import Path

from engines.exceptions import BackendUnavailable

# CPU flags that change which kernels an optimized CPU graph may contain.
_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
              "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")


@dataclass(frozen=True, slots=True)
class DeviceFingerprint:
    kind: str  # "cpu" | "cuda"
    name: str
    arch: str  # CPU: machine + ISA flags; CUDA: compute capability "9.0"
    driver: str | None = None
    cuda: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, str | None]) -> DeviceFingerprint:
        return cls(kind=str(d["kind"]), name=str(d["name"]), arch=str(d["arch"]),
                   driver=d.get("driver"), cuda=d.get("cuda"))

    def describe(self) -> str:
        extra = f", driver {self.driver}, CUDA {self.cuda}" if self.kind == "cuda" else ""
        return f"{self.kind}: {self.name} ({self.arch}{extra})"


def cpu_fingerprint() -> DeviceFingerprint:
    name, flags = platform.processor() or "unknown", set[str]()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name":
                name = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    isa = "+".join(f for f in _ISA_FLAGS if f in flags)
    return DeviceFingerprint("cpu", name, f"{platform.machine()}:{isa}")


def cuda_fingerprint(device: int = 0) -> DeviceFingerprint:
    """Fingerprint of CUDA device ``device`` via cuda-python (driver API)."""
    try:
        from cuda.bindings import driver, runtime
    except ImportError as exc:
        raise BackendUnavailable("cuda-python (cuda.bindings) does not import") from exc

    def check(result: tuple[object, ...]) -> object:
        err, *rest = result
        if int(err) != 0:  # type: ignore[call-overload]
            raise BackendUnavailable(f"CUDA driver call failed: {err}")
        return rest[0] if rest else None

    check(driver.cuInit(0))
    dev = check(driver.cuDeviceGet(device))
    raw = check(driver.cuDeviceGetName(256, dev))
    name = bytes(raw).split(b"\0", 1)[0].decode()  # type: ignore[call-overload]
    attr = driver.CUdevice_attribute
    major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                              dev))
    minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                              dev))
    drv = int(check(driver.cuDriverGetVersion()))  # type: ignore[call-overload]
    rt = int(check(runtime.cudaRuntimeGetVersion()))  # type: ignore[call-overload]
    return DeviceFingerprint("cuda", name, f"{major}.{minor}", driver=_version(drv),
                             cuda=_version(rt))


def _version(v: int) -> str:
    """CUDA encodes versions as 1000*major + 10*minor."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def current_fingerprint(kind: str, device: int = 0) -> DeviceFingerprint:
    return cuda_fingerprint(device) if kind == "cuda" else cpu_fingerprint()


def fingerprint_for(device: str) -> DeviceFingerprint:
    """The fingerprint of an engine device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``."""
    kind, _, index = device.partition(":")
    return current_fingerprint(kind, int(index or 0))
