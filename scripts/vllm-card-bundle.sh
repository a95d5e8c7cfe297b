#!/usr/bin/env bash
# vLLM 0.26.0 for the lent card (torch 2.11.0+cu130, Python 3.12; ../shared/GPU.md), as xz parts
# small enough that each travels with the checkout in one device call (64 MiB in all). It is
# ../shared/gpu/vllm-bundle.sh's recipe and lean list, plus what that list leaves out and the
# engine imports (benchmarks/vllm-0.26-extra-requirements.txt: without it `from vllm import LLM`
# failed, 2026-11-28), less files the offline LLM path never opens: the Rust frontend binary
# (vllm-rs, for `vllm serve`'s Rust frontend), DeepGEMM's and Blackwell attention's JIT headers,
# DeepGEMM's extension for other Pythons, pycountry's translations, Mistral's tokenizer files.
#   usage: scripts/vllm-card-bundle.sh OUTDIR [LEAN_LIST]    (5-15 min on 2 cores, mostly xz)
# Check it before a card is started (Python 3.12 + torch 2.11.0 here, no driver needed):
#   python3.12 -m venv /tmp/v312 && /tmp/v312/bin/pip install torch==2.11.0 transformers==5.17.0 peft==0.21.0
#   mkdir /tmp/site && cat OUTDIR/part.? | xz -dc | tar -C /tmp/site -xf -
#   PYTHONPATH=/tmp/site /tmp/v312/bin/python benchmarks/vllm_imports.py --no-driver
# Then on the card, one part per call, the last one unpacking and measuring (README: "vLLM on the card").
set -euo pipefail
out=${1:?usage: scripts/vllm-card-bundle.sh OUTDIR [LEAN_LIST]}
root=$(cd "$(dirname "$0")/.." && pwd)
lean=${2:-$root/../shared/gpu/vllm-0.26-lean-requirements.txt}
[ -f "$lean" ] || { echo "no lean list at $lean: give its path as the second argument" >&2; exit 2; }
mkdir -p "$out/wheels" "$out/site"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64)
get() { python3 -m pip download -q --no-deps "${plat[@]}" -d "$out/wheels" "$1" 2>&1 | grep -v '^WARNING' || true; }
get vllm==0.26.0
# a pin the registry no longer serves falls back to the newest release: said, since that build was not checked
grep -hv '^\s*\(#\|$\)' "$lean" "$root/benchmarks/vllm-0.26-extra-requirements.txt" | while read -r req; do
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$out/wheels" "$req" 2>/dev/null ||
    { echo "note: $req not served; taking the newest ${req%%==*}"; get "${req%%==*}"; }
done
python3 -m pip install -q --no-deps --no-compile "${plat[@]}" --target "$out/site" "$out"/wheels/*.whl 2>&1 |
  grep -v '^WARNING' || true
rm -rf "$out/wheels" "$out/site/bin"
(cd "$out/site" && rm -rf vllm/vllm-rs pycountry/locales mistral_common/data vllm/third_party/deep_gemm/include \
  vllm/third_party/fmha_sm100/cutlass && find vllm/third_party/deep_gemm -maxdepth 1 -name '_C.cpython-3*.so' \
  ! -name '_C.cpython-312-*' -delete)
tar -C "$out/site" -cf - . | xz -6 -T2 > "$out/vllm026.tar.xz"
rm -rf "$out/site"
# 57 MiB parts: each with the checkout (~2.6 MiB in 2026-11) stays under a call's 64 MiB
(cd "$out" && split -b 57M -d -a 1 vllm026.tar.xz part. && rm vllm026.tar.xz && ls -l part.*)
