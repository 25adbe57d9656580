#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/kernels_check.sh LIB NVCC: checks that LIB (libnccl.so.2) embeds ncclshim's CUDA kernels
# as the driver will find them: cuobjdump, reading the library's .nv_fatbin section, must
# list a cubin for every architecture NVCC lists, PTX of the newest, and in every cubin each
# kernel device.c launches (kr_dev_reduce_<type> for the twelve datatypes, kr_dev_copy,
# kr_dev_from, kr_dev_signal).
# cuobjdump comes from the toolkit, else from NVIDIA's PyPI package, installed under the
# library's build folder once. Without NVCC (a host-only build) it says so and passes.
# Prints each failed check, then `kernels: N passed, M failed`; exits 1 on any failure.
set -euo pipefail

lib=$1
nvcc=${2:-}
if [[ -z $nvcc || ! -x $nvcc ]]; then
    echo "kernels: skipped: no nvcc, so this build carries no kernels (host memory only)"
    exit 0
fi

cuobjdump=$(dirname "$nvcc")/cuobjdump
if [[ ! -x $cuobjdump ]]; then
    tools=$(dirname "$lib")/../tools/cuobjdump
    cuobjdump=$tools/nvidia/cu13/bin/cuobjdump
    if [[ ! -x $cuobjdump ]]; then
        mkdir -p "$tools"
        python3 -m pip install -q --disable-pip-version-check --target "$tools" \
            nvidia-cuda-cuobjdump >/dev/null 2>&1 ||
            python3 -m pip install -q --disable-pip-version-check --break-system-packages \
                --target "$tools" nvidia-cuda-cuobjdump >/dev/null 2>&1 || true
    fi
    if [[ ! -x $cuobjdump ]]; then
        echo "kernels: cuobjdump is neither in the toolkit nor installable from PyPI"
        echo "kernels: 0 passed, 1 failed"
        exit 1
    fi
fi

passed=0
failed=0
check() {
    if eval "$2"; then
        passed=$((passed + 1))
    else
        echo "kernels: FAILED: $1"
        failed=$((failed + 1))
    fi
}

archs=$("$nvcc" --list-gpu-arch | sed 's/compute_//' | sort -n)
newest=$(tail -n 1 <<<"$archs")
elves=$("$cuobjdump" --list-elf "$lib" 2>&1 || true)
ptx=$("$cuobjdump" --list-ptx "$lib" 2>&1 || true)
kernels="kr_dev_copy kr_dev_from kr_dev_signal"
for t in i8 u8 i32 u32 i64 u64 f16 bf16 f32 f64 e4m3 e5m2; do
    kernels="$kernels kr_dev_reduce_$t"
done

for arch in $archs; do
    check "a cubin for sm_$arch" "grep -q '\\.sm_${arch}\\.cubin' <<<\"\$elves\""
    symbols=$("$cuobjdump" --dump-elf-symbols -arch "sm_$arch" "$lib" 2>/dev/null || true)
    for k in $kernels; do
        check "$k in the sm_$arch cubin" "grep -qw '$k' <<<\"\$symbols\""
    done
done
check "PTX for compute_$newest" "grep -q '\\.sm_${newest}\\.ptx' <<<\"\$ptx\""

echo "kernels: $passed passed, $failed failed ($(wc -l <<<"$archs") architectures," \
    "$(wc -w <<<"$kernels") kernels each)"
((failed == 0))
