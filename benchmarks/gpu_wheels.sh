#!/usr/bin/env bash
# The wheels a GPU lease carries (git-excluded, rebuilt on each development machine):
#
#   bash benchmarks/gpu_wheels.sh        # .whl/, .whl/workflow and .whl-translation/, for the GPU image's Python 3.12
#
# .whl/: pycountry (the built-in language names; benchmarks/gpu.sh installs .whl/*.whl first).
# .whl/workflow: benchmarks/gpu_workflow_wheels.txt (Snakemake and what it needs beyond the image,
# jsonschema, the built-in data's packages and modsent's pinned transformers stack), for
# `gpu_workflow.py run --wheels`; gpu.sh also installs the ones modsent itself imports, for its tests.
# .whl-translation/: CTranslate2 (42 MB), for the translation blocks. A call carries at most 64 MiB:
# [".whl", ".gpu-workflow"] (about 61 MB) or [".whl-translation"], not both.
# Versions as constraints.txt; connection_pool has no wheel and is built from its source.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux_2_24_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
download() {  # download DIR REQUIREMENT...
    local dir="$1"
    shift
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${PLATFORMS[@]}" -d "$dir" "$@"
}
mkdir -p .whl/workflow
download .whl "$(grep -E '^pycountry==' constraints.txt)"
download .whl-translation "$(grep -E '^ctranslate2==' constraints.txt)"
download .whl/workflow -r <(grep -v -e '^#' -e '^connection_pool' benchmarks/gpu_workflow_wheels.txt)
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w .whl/workflow \
    "$(grep -E '^connection_pool==' benchmarks/gpu_workflow_wheels.txt)"
expected=$(grep -cv -e '^#' -e '^$' benchmarks/gpu_workflow_wheels.txt)
found=$(find .whl/workflow -type f -name '*.whl' | wc -l)
echo "== .whl: $(find .whl -maxdepth 1 -type f -name '*.whl' | wc -l) wheel(s); .whl/workflow: $found of $expected; $(du -sh .whl | cut -f1)" \
    "(with .gpu-workflow: $(du -sch .whl .gpu-workflow 2>/dev/null | tail -1 | cut -f1)); .whl-translation: $(du -sh .whl-translation | cut -f1)"
((found >= expected)) || { echo "missing wheels in .whl/workflow" >&2; exit 1; }
