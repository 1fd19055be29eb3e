#!/usr/bin/env bash
# Install the pinned CUDA command-line tools RUDA validates against, from PyPI, without a GPU:
#   nvidia-cuda-nvcc-cu12   -> nvidia/cuda_nvcc/bin/ptxas
#   nvidia-cuda-nvrtc-cu12  -> nvidia/cuda_nvrtc/lib/libnvrtc.so.12
#   nvidia-cuda-nvdisasm    -> nvidia/cu13/bin/nvdisasm (PyPI has only 13.x; it reads 12.9 cubins)
# into RUDA_TOOLS_DIR (default: ${XDG_CACHE_HOME:-$HOME/.cache}/ruda/cuda-tools/12.9.86), a
# folder shared by every clone and CI run of this machine. Idempotent: a quick no-op when the
# tools are already there.
#
# Usage:
#   scripts/install-cuda-tools.sh               install if missing, print the paths
#   scripts/install-cuda-tools.sh --print-env   same, then print `export RUDA_PTXAS=...` lines
#   eval "$(scripts/install-cuda-tools.sh --print-env --quiet)"
#   source scripts/install-cuda-tools.sh        install if missing and export the variables

_ruda_cuda_tools_main() {
    local version="12.9.86" nvdisasm_version="13.2.51"
    local dir="${RUDA_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ruda/cuda-tools/$version}"
    local print_env=0 quiet=0 arg
    for arg in "$@"; do
        case "$arg" in
            --print-env) print_env=1 ;;
            --quiet) quiet=1 ;;
            -h|--help)
                sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
                return 0 ;;
            *) echo "install-cuda-tools: unknown argument '$arg' (try --help)" >&2; return 2 ;;
        esac
    done

    local ptxas="$dir/nvidia/cuda_nvcc/bin/ptxas"
    local nvrtc="$dir/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
    local nvdisasm="$dir/nvidia/cu13/bin/nvdisasm"
    _ruda_complete() { [ -x "$ptxas" ] && [ -e "$nvrtc" ] && [ -x "$nvdisasm" ]; }

    if ! _ruda_complete; then
        # Install both wheels with one pip call into a fresh folder, then move it into place:
        # pip's --target replaces a whole top-level folder (`nvidia/`) that already exists, and
        # a half-finished install (or a concurrent one) must never look complete.
        local parent tmp log
        parent="$(dirname "$dir")"
        mkdir -p "$parent" || return 1
        tmp="$(mktemp -d "$parent/.install-$version.XXXXXX")" || return 1
        log="$tmp.log"
        [ "$quiet" = 1 ] || echo "install-cuda-tools: installing CUDA $version ptxas and NVRTC from PyPI into $dir" >&2
        if ! python3 -m pip install --disable-pip-version-check --no-deps --no-input \
                --target "$tmp" "nvidia-cuda-nvcc-cu12==$version" "nvidia-cuda-nvrtc-cu12==$version" \
                "nvidia-cuda-nvdisasm==$nvdisasm_version" \
                >"$log" 2>&1; then
            echo "install-cuda-tools: pip failed; its log:" >&2
            cat "$log" >&2
            rm -rf "$tmp" "$log"
            return 1
        fi
        rm -f "$log"
        # Wheels do not always keep the executable bit.
        chmod +x "$tmp/nvidia/cuda_nvcc/bin/"* "$tmp/nvidia/cu13/bin/"* 2>/dev/null
        if _ruda_complete; then
            rm -rf "$tmp"   # another run finished first
        elif [ ! -e "$dir" ]; then
            mv "$tmp" "$dir" || { rm -rf "$tmp"; return 1; }
        else
            # A partial folder (or one the user chose): merge rather than delete it.
            cp -a "$tmp/." "$dir/" || { rm -rf "$tmp"; return 1; }
            rm -rf "$tmp"
        fi
    fi
    if ! _ruda_complete; then
        unset -f _ruda_complete
        echo "install-cuda-tools: expected $ptxas, $nvrtc and $nvdisasm after installing; did the wheel layout change?" >&2
        return 1
    fi
    unset -f _ruda_complete

    if [ "$quiet" != 1 ]; then
        echo "ptxas:  $ptxas" >&2
        echo "nvrtc:  $nvrtc" >&2
        echo "nvdisasm: $nvdisasm" >&2
    fi
    if [ "$print_env" = 1 ]; then
        printf 'export RUDA_PTXAS=%q\n' "$ptxas"
        printf 'export RUDA_NVRTC=%q\n' "$nvrtc"
        printf 'export RUDA_NVDISASM=%q\n' "$nvdisasm"
    fi
    if [ "${_ruda_sourced:-0}" = 1 ]; then
        export RUDA_PTXAS="$ptxas" RUDA_NVRTC="$nvrtc" RUDA_NVDISASM="$nvdisasm"
    fi
    return 0
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    _ruda_sourced=1
    _ruda_cuda_tools_main "$@"
    _ruda_sourced=$?
    unset -f _ruda_cuda_tools_main
    # `return` is valid here because the file is being sourced.
    eval "unset _ruda_sourced; return $_ruda_sourced"
else
    set -u
    _ruda_sourced=0
    _ruda_cuda_tools_main "$@"
fi
