#!/usr/bin/env python3
"""Capture NVML health readings as JSON, through ctypes (no Python package needed).

Run on a GPU node: `python3 scripts/gpu-health-capture.py > nvml-health.json`. Every NVML call is recorded with
its return code (0 = success, 3 = not supported, 10 = timeout ...), so the replay tests see what the driver
really answered, including the calls a given GPU does not support. Used by scripts/gpu-health-capture.sh.
"""
import ctypes
import json
import os
import sys
import time

CANDIDATES = [
    "libnvidia-ml.so.1",
    "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
]


def load():
    for c in CANDIDATES:
        try:
            return ctypes.CDLL(c), c
        except OSError:
            continue
    sys.exit("no libnvidia-ml.so.1")


nvml, libpath = load()
U = ctypes.c_uint
ULL = ctypes.c_ulonglong


def call(name, *args):
    fn = getattr(nvml, name, None)
    if fn is None:
        return -1
    return fn(*args)


def s(buf):
    return buf.value.decode(errors="replace")


class PciInfo(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", U),
        ("bus", U),
        ("device", U),
        ("pciDeviceId", U),
        ("pciSubSystemId", U),
        ("busId", ctypes.c_char * 32),
    ]


class Memory(ctypes.Structure):
    _fields_ = [("total", ULL), ("free", ULL), ("used", ULL)]


class EventData(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_void_p),
        ("eventType", ULL),
        ("eventData", ULL),
        ("gpuInstanceId", U),
        ("computeInstanceId", U),
    ]


out = {"library": libpath, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "system": {}, "gpus": [], "p2p": []}
out["init"] = call("nvmlInit_v2")
buf = ctypes.create_string_buffer(96)
r = call("nvmlSystemGetDriverVersion", buf, 96)
out["system"]["driver_version"] = {"ret": r, "value": s(buf) if r == 0 else None}
r = call("nvmlSystemGetNVMLVersion", buf, 96)
out["system"]["nvml_version"] = {"ret": r, "value": s(buf) if r == 0 else None}
v = ctypes.c_int()
r = call("nvmlSystemGetCudaDriverVersion_v2", ctypes.byref(v))
out["system"]["cuda_driver_version"] = {"ret": r, "value": v.value if r == 0 else None}

count = U()
out["system"]["count"] = {"ret": call("nvmlDeviceGetCount_v2", ctypes.byref(count)), "value": count.value}
handles = []
for i in range(count.value):
    h = ctypes.c_void_p()
    call("nvmlDeviceGetHandleByIndex_v2", U(i), ctypes.byref(h))
    handles.append(h)
    g = {"index": i}

    def one(key, fn, ctype=U, *pre):
        val = ctype()
        r = call(fn, h, *pre, ctypes.byref(val))
        g[key] = {"ret": r, "value": val.value if r == 0 else None}

    r = call("nvmlDeviceGetName", h, buf, 96)
    g["name"] = {"ret": r, "value": s(buf) if r == 0 else None}
    r = call("nvmlDeviceGetUUID", h, buf, 96)
    g["uuid"] = {"ret": r, "value": s(buf) if r == 0 else None}
    pci = PciInfo()
    r = call("nvmlDeviceGetPciInfo_v3", h, ctypes.byref(pci))
    g["pci_bus_id"] = {"ret": r, "value": pci.busId.decode() if r == 0 else None}
    one("persistence_mode", "nvmlDeviceGetPersistenceMode")
    one("pcie_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration")
    one("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration")
    one("pcie_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration")
    one("pcie_width_current", "nvmlDeviceGetCurrPcieLinkWidth")
    one("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")
    cur, pend = U(), U()
    r = call("nvmlDeviceGetEccMode", h, ctypes.byref(cur), ctypes.byref(pend))
    g["ecc_mode"] = {"ret": r, "current": cur.value if r == 0 else None, "pending": pend.value if r == 0 else None}
    # nvmlMemoryErrorType_t: 0 corrected, 1 uncorrected; nvmlEccCounterType_t: 0 volatile, 1 aggregate.
    for et, en in ((0, "corrected"), (1, "uncorrected")):
        for ct, cn in ((0, "volatile"), (1, "aggregate")):
            val = ULL()
            r = call("nvmlDeviceGetTotalEccErrors", h, U(et), U(ct), ctypes.byref(val))
            g[f"ecc_{en}_{cn}"] = {"ret": r, "value": val.value if r == 0 else None}
    c, u, p, f = U(), U(), U(), U()
    r = call("nvmlDeviceGetRemappedRows", h, ctypes.byref(c), ctypes.byref(u), ctypes.byref(p), ctypes.byref(f))
    g["remapped_rows"] = {"ret": r, "correctable": c.value, "uncorrectable": u.value, "pending": p.value, "failure": f.value} if r == 0 else {"ret": r}
    pend = U()
    # nvmlPageRetirementCause_t 0 multiple single-bit, 1 double-bit
    r = call("nvmlDeviceGetRetiredPagesPendingStatus", h, ctypes.byref(pend))
    g["retired_pages_pending"] = {"ret": r, "value": pend.value if r == 0 else None}
    for cause in (0, 1):
        n = U(0)
        r = call("nvmlDeviceGetRetiredPages", h, U(cause), ctypes.byref(n), None)
        g[f"retired_pages_cause{cause}"] = {"ret": r, "count": n.value}
    links = []
    for link in range(18):  # NVML_NVLINK_MAX_LINKS
        act = U()
        r = call("nvmlDeviceGetNvLinkState", h, U(link), ctypes.byref(act))
        links.append({"link": link, "ret": r, "active": act.value if r == 0 else None})
    g["nvlink"] = links
    mem = Memory()
    r = call("nvmlDeviceGetMemoryInfo", h, ctypes.byref(mem))
    g["memory"] = {"ret": r, "total": mem.total, "used": mem.used} if r == 0 else {"ret": r}
    one("temperature_gpu", "nvmlDeviceGetTemperature", U, U(0))
    # Supported event types (bitmask): xid critical = 0x8, single-bit ECC 0x1, double-bit ECC 0x2.
    one("supported_event_types", "nvmlDeviceGetSupportedEventTypes", ULL)
    out["gpus"].append(g)

# Peer-to-peer status (nvmlGpuP2PCapsIndex_t: 0 read, 1 write, 2 nvlink, 3 atomics, 4 prop, 6 pcie)
for a in range(len(handles)):
    for b in range(len(handles)):
        row = {"a": a, "b": b}
        for idx, nm in ((0, "read"), (1, "write"), (2, "nvlink"), (3, "atomics"), (6, "pcie")):
            st = U()
            r = call("nvmlDeviceGetP2PStatus", handles[a], handles[b], U(idx), ctypes.byref(st))
            row[nm] = {"ret": r, "status": st.value if r == 0 else None}
        lvl = U()
        r = call("nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b], ctypes.byref(lvl))
        row["topology"] = {"ret": r, "level": lvl.value if r == 0 else None}
        out["p2p"].append(row)

# Xid / ECC events: register and wait briefly (a healthy GPU gives NVML_ERROR_TIMEOUT = 10).
es = ctypes.c_void_p()
r = call("nvmlEventSetCreate", ctypes.byref(es))
ev = {"create": r, "register": [], "waits": []}
if r == 0:
    for i, h in enumerate(handles):
        ev["register"].append({"gpu": i, "ret": call("nvmlDeviceRegisterEvents", h, ULL(0x8 | 0x1 | 0x2), es)})
    for _ in range(2):
        d = EventData()
        r = call("nvmlEventSetWait_v2", es, ctypes.byref(d), U(500))
        ev["waits"].append({"ret": r, "event_type": d.eventType if r == 0 else None, "event_data": d.eventData if r == 0 else None})
    call("nvmlEventSetFree", es)
out["events"] = ev
out["shutdown"] = call("nvmlShutdown")
json.dump(out, sys.stdout, indent=1)
print()
