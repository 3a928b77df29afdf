#!/usr/bin/env bash
# Installs the system packages the engine build needs (cmake, libclang for bindgen, patch, a
# C/C++ compiler) when they are missing. Idempotent; needs root only when something is missing.
set -euo pipefail

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v patch >/dev/null 2>&1 || missing+=(patch)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
if ! ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 \
   && [ -z "${LIBCLANG_PATH:-}" ]; then
  missing+=(libclang-dev)
fi
command -v cargo >/dev/null 2>&1 || { echo "error: cargo is not installed (https://rustup.rs)" >&2; exit 1; }
for tool in fmt clippy; do
  cargo "$tool" --version >/dev/null 2>&1 \
    || { echo "error: cargo $tool is missing (make test checks the tree with it): rustup component add $([ $tool = fmt ] && echo rustfmt || echo clippy)" >&2; exit 1; }
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing build dependencies: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "error: missing ${missing[*]}; run as root or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: missing ${missing[*]} and no apt-get here; install them with your package manager" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
