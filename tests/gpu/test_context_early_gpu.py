"""engines.context_early on a real GPU: the thread makes the device's primary context before
torch touches CUDA, and torch's runtime then computes in that same context (in a fresh
process: the thread does nothing once torch is imported)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from engines.context_early import begin_context
from cuda.bindings import driver

thread = begin_context(0)
import torch
thread.join(60)
err, dev = driver.cuDeviceGet(0)
err2, flags, active = driver.cuDevicePrimaryCtxGetState(dev)
before_torch = bool(active)
x = torch.arange(4, device="cuda", dtype=torch.float32).sum()
err3, current = driver.cuCtxGetCurrent()
err4, primary = driver.cuDevicePrimaryCtxRetain(dev)
print(json.dumps({"errors": [int(e) for e in (err, err2, err3, err4)],
                  "active_before_torch": before_torch, "sum": float(x.item()),
                  "same_context": int(current) == int(primary) and int(primary) != 0}))
"""


def test_torch_computes_in_the_context_the_thread_made() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT)], capture_output=True,
                         text=True, timeout=180, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"errors": [0, 0, 0, 0], "active_before_torch": True, "sum": 6.0,
                   "same_context": True}, out.stderr[-2000:]
