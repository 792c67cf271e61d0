#!/usr/bin/env bash
# Capture a GPU node's health readings for vigil's replay tests (issue #17): nvidia-smi's full query (text and XML),
# the topology and peer-to-peer matrices, NVLink status, and NVML readings through ctypes. Writes into $OUT.
#   OUT=/tmp/h bash scripts/gpu-health-capture.sh
set -u
OUT=${OUT:?set OUT to a folder}
mkdir -p "$OUT"
t() { timeout 30 "$@" 2>&1; echo "# rc=$?"; }
{ date -u +%Y-%m-%dT%H:%M:%SZ; uname -r; t nvidia-smi -L; } >"$OUT/machine.txt"
t nvidia-smi -q >"$OUT/smi-q.txt"
t nvidia-smi -q -x >"$OUT/smi-q.xml"
{
  for a in m "p2p r" "p2p w" "p2p n" "p2p a" "p2p p"; do echo "## nvidia-smi topo -$a"; t nvidia-smi topo -$a; done
} >"$OUT/topo.txt"
{
  echo "## nvidia-smi nvlink -s"; t nvidia-smi nvlink -s
  echo "## nvidia-smi nvlink -c"; t nvidia-smi nvlink -c
  echo "## nvidia-smi --query-gpu"
  t nvidia-smi --query-gpu=index,pci.bus_id,persistence_mode,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.volatile.total,remapped_rows.pending,remapped_rows.failure,retired_pages.pending --format=csv
} >"$OUT/nvlink-query.txt"
timeout 60 python3 "$(dirname "$0")/gpu-health-capture.py" >"$OUT/nvml-health.json" 2>"$OUT/nvml-stderr.txt"
echo "nvml rc=$?" >>"$OUT/machine.txt"
