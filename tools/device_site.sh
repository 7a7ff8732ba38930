#!/bin/sh
# The Python packages the GPU closed loop needs on the device machine, as one archive that fits
# beside the working tree (the device tool carries at most 64 MiB in all; the tree is ~58 MB).
#
# The device machine has Python 3.12, torch and CUDA (and the SymPy torch requires: 1.14.0 on
# 2026-12-04), but neither pydantic (perfcast's specs) nor perfcast's pinned transformers, and it
# reaches no registry. This downloads their wheels for CPython 3.12 on x86-64 Linux, unpacks them,
# keeps only the transformers model folders the closed loop builds (its default models: llama,
# qwen3, qwen3_moe; the rest are imported by name, lazily) and writes .site.tgz (~5.6 MB) in the
# repository root, ignored by git.
# On the device machine: mkdir -p /tmp/site && tar xzf .site.tgz -C /tmp/site and put /tmp/site
# first on PYTHONPATH (docs/design/validation.md, "GPU closed loop").
#
# Usage: sh tools/device_site.sh [extra transformers model folder ...]
set -eu
cd "$(dirname "$0")/.."
keep="auto llama qwen3 qwen3_moe qwen2 qwen2_moe mistral deepseek_v3 $*"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$work/whl" \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing-extensions==4.16.0 transformers==5.24.0 regex==2026.11.19
mkdir "$work/site"
for w in "$work"/whl/*.whl; do python3 -m zipfile -e "$w" "$work/site"; done
for d in "$work"/site/transformers/models/*/; do
  name=$(basename "$d")
  case " $keep " in *" $name "*) ;; *) rm -rf "$d" ;; esac
done
tar czf .site.tgz -C "$work/site" .
grep -qx '/.site.tgz' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.site.tgz >> .git/info/exclude; }
ls -l .site.tgz
