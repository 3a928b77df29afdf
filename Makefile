# Two commands for a fresh machine: `make demo` (the main job end to end) and `make test`.
SHELL   := /bin/bash
CARGO   ?= cargo
BIN     := target/release/sovereign
MODELS  := models
RESULTS := results

.PHONY: deps build demo campaign tau-sweep lint test bench bench-big clean

deps:
	@scripts/deps.sh

build: deps
	$(CARGO) build --release --locked

# The main job end to end (scripts/demo.sh): the `small` model resident, then stock mmap and
# F with LRU under a 128 MiB hard limit, compared with the oracle, certified, in one table.
demo: build
	BIN=$(BIN) scripts/demo.sh

# The shipped exactness campaign on the tiny model, unattended, then its tables, figure and
# draft claim ledger, verified and replayed. Running it again continues (or does nothing).
campaign: build
	@mkdir -p $(RESULTS)
	$(BIN) campaign run campaigns/exactness.yaml
	set -o pipefail; $(BIN) export --campaign exactness-resident-1 --out $(RESULTS)/export-exactness | tee $(RESULTS)/export-exactness.txt
	@# export prints the claim's verify and replay commands, anchored by its digest: run them.
	@grep -E '^  \S+ (verify|replay) --claim ' $(RESULTS)/export-exactness.txt | while read -r cmd; do echo "$$cmd"; $$cmd || exit 1; done

# Margin-gated deferred refinement (seed 001): the campaign's recipes forge one checkpoint at
# F32 and quantize it to the Q4_K_M base and the Q8_0 verifier; the margins of the base, then
# the preregistered τ sweep unattended (resident and streamed-under-a-cap verifiers), then its
# CSV and quality-versus-bytes figure.
tau-sweep: build
	@mkdir -p $(RESULTS)
	$(BIN) campaign check --make-models campaigns/tau-sweep.yaml
	$(BIN) margins --reference $(MODELS)/tau-f32.gguf --candidate $(MODELS)/tau-q4_k_m.gguf --prompts campaigns/prompts/tau.txt
	$(BIN) campaign run campaigns/tau-sweep.yaml
	$(BIN) export --campaign tau-sweep-small-4 --out $(RESULTS)/export-tau-sweep

# The tree as rustfmt.toml formats it, and no clippy warning in any target (part of `make test`).
lint: deps
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets --locked -- -D warnings

# The whole suite: every test binary runs (--no-fail-fast), failures are reported as cargo
# reports them and fail the target. Each test's time is printed with its result
# (scripts/test-runner.sh, the runner of the test binaries only), and the ten slowest close the
# output (scripts/slowest-tests.sh), so a slowdown shows when it lands. Last, a backstop: Slurm
# daemons a test started and a killed test binary could not stop are stopped (a cluster that
# was running before the suite is left alone: the tests note what they start).
# `make test TEST_ARGS='--test it rpc::'` runs a part of the suite the same way.
TEST_ARGS ?=
test: deps lint
	@mkdir -p target
	@set -o pipefail; \
	$(CARGO) test --locked --no-fail-fast $(TEST_ARGS) --config "target.'cfg(all())'.runner = '$(CURDIR)/scripts/test-runner.sh'" 2>&1 \
	  | tee target/test-output.log; \
	status=$${PIPESTATUS[0]}; \
	scripts/slurm.sh stop --started-by tests; \
	echo; scripts/slowest-tests.sh target/test-output.log 10; \
	exit $$status

# The shipped bench campaign (campaigns/bench.yaml) on the several-GiB bench model: stock, P,
# D, F and F+LRU under one hard host cap against the resident oracle, with the envelope, a
# warm resident run and a replay of F's own reads in every block; then the bench table, F/D,
# F's ratio to its floor and to the envelope, wall time against stock; then a 4,244-token
# prefill on a 24 x 256-expert model under a third of its size (campaigns/bench-prefill.yaml):
# F's prefill over its floor, stock's over F's, budget-sized against hand-sized decode
# (BENCH_PREFILL=0 leaves it out); then the same bench
# model with skewed routing (campaigns/bench-skew.yaml): F and F+LRU against stock; then F
# with proposers, its own MTP head among them, on a bench-sized qwen35moe with one MTP block
# (campaigns/bench-draft.yaml, BENCH_DRAFT=0 leaves it out) against plain F;
# then eight requests as one session through F with LRU (reset, cold) against separate runs
# (campaigns/bench-session.yaml, BENCH_SESSION=0 leaves it out)
# (BENCH_OUTPUTS, BENCH_BLOCKS scale the first down; BENCH_SKEW=0 leaves the second out).
bench: build
	BIN=$(BIN) scripts/bench.sh

# A shard set 1.5 x this machine's memory, forged once into models/big/, with no cgroup cap:
# stock llama.cpp (mmap) and F with LRU against a zero-cache D oracle, each from a cold page
# cache: prefill and decode tok/s, major faults, host peak, wall, exactness (scripts/bench-big.sh).
bench-big: build
	BIN=$(BIN) scripts/bench-big.sh

clean:
	$(CARGO) clean
	rm -rf $(MODELS)
