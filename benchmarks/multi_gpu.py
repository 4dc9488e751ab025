"""vkshmem between two GPUs of one node next to NVSHMEM and ``cudaMemcpyPeer``, in one command.

    python benchmarks/multi_gpu.py --json benchmarks/results/nvidia-h200x2.json

runs ``vkshmem run -n 2 benchmarks/multi_gpu_pe.py`` once per GPU domain (``--domains``,
default ``cuda,vulkan``, each followed by a job of the per-call rows and the all-reduce with
its service kernel off;
the first job also measures NVSHMEM through nvshmem4py, the ``cudaMemcpyPeer`` ceiling
through CuPy and NCCL's all-reduce through torch.distributed, when they import), one PE per
GPU, then prints one table and writes the rows ``{"op", "bytes", "domain", "vkshmem",
"nvshmem", "ceiling", "unit"}`` (the all-reduce's also ``ceiling_one_way``, ``nccl``,
``nccl_in_place``) with the date, the devices, the driver and the command. Ratios:
vkshmem/ceiling for GB/s rows, ceiling/vkshmem and nvshmem/vkshmem for time rows (above 1:
vkshmem is faster).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _have(module: str) -> bool:
    try:
        __import__(module)
    except Exception:
        return False
    return True


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return "; ".join(out)


def _job(domain: str, extra: list[str], quick: bool, timeout: float,
         env_extra: dict[str, str] | None = None, label: str = "") -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, "-m", "vkshmem", "run", "-n", "2", "--timeout", str(int(timeout)),
               str(HERE / "multi_gpu_pe.py"), "--domain", domain, "--json", str(out), *extra]
        if quick:
            cmd.append("--quick")
        print("$", " ".join(cmd), flush=True)
        env = dict(os.environ)
        env.setdefault("VKSHMEM_GPU_SYMMETRIC_SIZE", "1200M")
        env.setdefault("NVSHMEM_SYMMETRIC_SIZE", "2G")
        env.update(env_extra or {})
        proc = subprocess.run(cmd, env=env, timeout=timeout + 60, check=False)
        if proc.returncode != 0 or not out.exists():
            print(f"multi_gpu: the {domain} job failed (exit status {proc.returncode})",
                  flush=True)
            return {"domain": label or domain, "failed": proc.returncode, "rows": []}
        job = json.loads(out.read_text())
        job["domain"] = label or job["domain"]
        return job


#: the variable that turns each domain's service kernel off
_SERVICE_VARS = {"cuda": "VKSHMEM_CUDA_SERVICE", "vulkan": "VKSHMEM_GPU_CUDA_SERVICE"}


def _ratio(row: dict[str, Any], other: str) -> str:
    v, o = row["vkshmem"], row[other]
    if not v or not o:
        return "-"
    return f"{(v / o if row['unit'] == 'GB/s' else o / v):.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", default="cuda,vulkan", help="GPU domains to measure, in order")
    ap.add_argument("--quick", action="store_true", help="fewer sizes, shorter rounds")
    ap.add_argument("--timeout", type=float, default=280, help="seconds per job")
    ap.add_argument("--json", help="write the merged table here")
    ap.add_argument("--no-service-job", action="store_true",
                    help="skip each domain's job with its service kernel off "
                         "(VKSHMEM_CUDA_SERVICE=off, VKSHMEM_GPU_CUDA_SERVICE=off: per-call rows "
                         "and the all-reduce)")
    args = ap.parse_args()
    extra = [x for x, ok in (("--nvshmem", _have("nvshmem.core")), ("--ceiling", _have("cupy")),
                             ("--nccl", _have("torch.distributed")))
             if ok]
    jobs = []
    for i, domain in enumerate(d for d in args.domains.split(",") if d):
        jobs.append(_job(domain, extra if i == 0 else [], args.quick, args.timeout))
        if domain in _SERVICE_VARS and not args.no_service_job:  # without the service kernel
            jobs.append(_job(domain, ["--latency-only"], args.quick, args.timeout,
                             {_SERVICE_VARS[domain]: "off"}, f"{domain}, service off"))
    rows = [dict(r, domain=j["domain"]) for j in jobs for r in j["rows"]]
    print(f"\n{'op':<20} {'bytes':>10} {'domain':<17} {'vkshmem':>9} {'nvshmem':>9} "
          f"{'ceiling':>9} {'unit':>5} {'/ceil':>6} {'/nvshm':>6}")
    for r in rows:
        cells = [("-" if r[k] is None else r[k]) for k in ("vkshmem", "nvshmem", "ceiling")]
        print(f"{r['op']:<20} {r['bytes']:>10} {r['domain']:<17} {cells[0]:>9} {cells[1]:>9} "
              f"{cells[2]:>9} {r['unit']:>5} {_ratio(r, 'ceiling'):>6} "
              f"{_ratio(r, 'nvshmem'):>6}")
    for r in rows:  # the all-reduce's other references, where measured
        for k in ("ceiling_one_way", "nccl", "nccl_in_place"):
            if r.get(k) and r["vkshmem"]:
                print(f"{r['op']} ({r['domain']}): {k} {r[k]} us, {k}/vkshmem "
                      f"{r[k] / r['vkshmem']:.2f}")
    failed = [j["domain"] for j in jobs if "failed" in j]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(), "driver": _driver(),
                       "command": "python benchmarks/multi_gpu.py --json " + args.json
                       + (" --quick" if args.quick else ""),
                       "jobs": [{k: v for k, v in j.items() if k != "rows"} for j in jobs],
                       "ratio": "vkshmem/ceiling for GB/s rows; ceiling/vkshmem and "
                                "nvshmem/vkshmem for us rows (above 1: vkshmem is faster)",
                       "rows": rows}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
