#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# tools/check_layers.sh RULES FILE...: fails when a library source includes a layer above its
# own. Run from the repository root; the Makefile runs it before it builds the library.
#
# RULES is ARCHITECTURE.md. Its ```layers block has a line per layer: the folder, a colon, and
# the folders its files may include besides their own ('#' starts a comment). Every FILE
# (a path from the root) must lie in a folder the block names. Each of its `#include "..."`
# is resolved as the compiler resolves it under -I. (beside the file first, then from the
# root) and must land in the file's own folder or in one its line names. System headers
# (<...>) are not ours and are not checked. Prints one line per offending include and exits
# 1; exits 2 when RULES has no block.
set -euo pipefail

rules=$1
shift

declare -A allowed # layer -> " base kernels ... " (spaces around every name)
layers=0
in_block=0
while IFS= read -r line; do
    if ((!in_block)); then
        [[ $line == '```layers'* ]] && in_block=1
        continue
    fi
    [[ $line == '```'* ]] && break
    line=${line%%#*}
    [[ $line == *:* ]] || continue
    read -r layer <<<"${line%%:*}"
    read -ra below <<<"${line#*:}"
    allowed[$layer]=" ${below[*]} "
    layers=$((layers + 1))
done <"$rules"
if ((layers == 0)); then
    echo "check_layers: $rules has no \`\`\`layers block saying which layer may include which"
    exit 2
fi

bad=0
includes=0
report() {
    echo "check_layers: $*"
    bad=$((bad + 1))
}

for file in "$@"; do
    layer=${file%%/*}
    if [[ $file != */* || -z ${allowed[$layer]+set} ]]; then
        report "$file: its folder is no layer of $rules (add a line to its \`\`\`layers block)"
        continue
    fi
    dir=$(dirname "$file")
    while IFS=: read -r lineno text; do
        [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]] || continue
        name=${BASH_REMATCH[1]}
        includes=$((includes + 1))
        if [[ -e $dir/$name ]]; then
            target=$(realpath -m --relative-to=. "$dir/$name")
        elif [[ -e $name ]]; then
            target=$(realpath -m --relative-to=. "$name")
        else
            report "$file:$lineno: \"$name\" is neither beside the file nor under the root"
            continue
        fi
        to=${target%%/*}
        [[ $target == */* ]] || to="(the root)"
        if [[ $to != "$layer" && ${allowed[$layer]} != *" $to "* ]]; then
            read -ra below <<<"${allowed[$layer]}"
            report "$file:$lineno: includes $target, but $layer/ may include only itself" \
                "and ${below[*]:-nothing else}"
        fi
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include' "$file" || true)
done

if ((bad > 0)); then
    echo "check_layers: $bad include(s) break the layers of $rules"
    exit 1
fi
echo "layers: $# files, $includes includes of our own, none runs up a layer"
