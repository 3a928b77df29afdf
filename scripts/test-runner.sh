#!/usr/bin/env bash
# Cargo's runner for the test binaries of `make test` (the Makefile sets it with --config for
# that one cargo call): runs BINARY ARGS... with libtest's per-test times on, so each result
# line ends in its time (`test NAME ... ok <1.234s>`), which scripts/slowest-tests.sh reads.
#
# `--report-time` is an unstable libtest option: libtest accepts it on a stable toolchain when
# RUSTC_BOOTSTRAP is set in the test binary's environment at run time. It is set here, for the
# test binaries (and what they start; none of it compiles Rust), never for cargo: there it
# would reach build scripts that probe for nightly features (anyhow, proc-macro2, thiserror)
# and make them rebuild their crates. It changes no test, only what libtest prints.
#
# OMP_WAIT_POLICY=passive (unless set already): libtest runs two tests at a time, each engine
# runs two OpenMP threads, and on two cores threads that spin between parallel regions starve
# the other test's; asleep instead, plan_exactness took 47 s instead of 200 s. It changes no
# computed byte, only how idle threads wait; benchmarks keep the runtime's default.
#
# RUST_TEST_THREADS=3 (unless set): many tests wait on others (Slurm, servers, the disk), so a
# third test at a time fills the two cores (the integration tests took 283 s, against 377 s two
# at a time and 260 s four at a time, which loads timing claims more than it saves).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/test-runner.sh BINARY [ARGS...]" >&2; exit 2; }
exec env RUSTC_BOOTSTRAP=1 OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}" RUST_TEST_THREADS="${RUST_TEST_THREADS:-3}" \
  "$@" -Z unstable-options --report-time
