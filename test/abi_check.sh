#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/abi_check.sh GENUINE_LIB OUR_LIB: checks that our libnccl.so.2 can stand in for NVIDIA's.
# One check per function NVIDIA's library exports (T or W in `nm -D --defined-only`): ours must
# export it as a function too. Then: ours exports nothing but nccl* and pnccl* (everything
# else hidden); its SONAME is libnccl.so.2; and `ldd` shows it needs no CUDA library
# (libcudart, libcuda, libnvidia-*), since the driver is opened with dlopen when present.
# Prints each failed check, then `abi: N passed, M failed`; exits 1 on any failure. Run by the
# Makefile's test-abi target.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 GENUINE_LIB OUR_LIB" >&2
    exit 2
fi
genuine=$1
ours=$2
for lib in "$genuine" "$ours"; do
    if [[ ! -f $lib ]]; then
        echo "abi: $lib not found"
        echo "abi: 0 passed, 1 failed"
        exit 1
    fi
done

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() {
    echo "FAIL $*"
    failed=$((failed + 1))
}

# "type name" of each defined dynamic symbol, without a version suffix (name@@VER).
dynsyms() {
    nm -D --defined-only "$1" | awk 'NF >= 3 { sub(/@.*/, "", $3); print $2, $3 }'
}

genuine_funcs=$(dynsyms "$genuine" | awk '$1 == "T" || $1 == "W" { print $2 }' | sort -u)
our_syms=$(dynsyms "$ours")
our_funcs=$(awk '$1 == "T" || $1 == "W" || $1 == "i" { print $2 }' <<<"$our_syms" | sort -u)

missing=$(comm -23 <(echo "$genuine_funcs") <(echo "$our_funcs"))
while read -r name; do
    [[ -n $name ]] || continue
    if grep -qxF "$name" <<<"$missing"; then
        fail "missing function: $name (NVIDIA's library exports it)"
    else
        pass
    fi
done <<<"$genuine_funcs"

# Linker-made markers some toolchains leave in .dynsym are not ours to hide.
foreign=$(awk '$2 !~ /^p?nccl/ && $2 !~ /^(_init|_fini|_edata|_end|__bss_start)$/ {
    print $1, $2 }' <<<"$our_syms")
if [[ -n $foreign ]]; then
    fail "exports outside nccl*/pnccl* (they must be hidden):"
    awk 'NR <= 40 { print "    " $0 }' <<<"$foreign"
else
    pass
fi

soname=$(readelf -d "$ours" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
if [[ $soname == libnccl.so.2 ]]; then
    pass
else
    fail "SONAME is '${soname:-none}', expected libnccl.so.2"
fi

cuda_deps=$(ldd "$ours" | grep -Ei 'libcudart|libcuda\.|libnvidia|libcublas|libnvrtc' || true)
if [[ -z $cuda_deps ]]; then
    pass
else
    fail "links CUDA libraries (the driver must be opened with dlopen):"
    awk '{ print "    " $0 }' <<<"$cuda_deps"
fi

echo "abi: $passed passed, $failed failed ($(wc -l <<<"$genuine_funcs") functions in" \
    "$(basename "$genuine"))"
((failed == 0))
