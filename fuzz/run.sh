#!/usr/bin/env bash
# Builds every fuzz target with libFuzzer on the stable toolchain and runs
# each for a bounded time (default 30 s), from the committed seed corpus.
# Fails on the first crash, leak-free timeout or OOM, leaving the input in
# fuzz/artifacts/<target>/; prints the executions of each target.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#
# Coverage instrumentation is LLVM's SanitizerCoverage, switched on with
# stable codegen flags (the same ones `cargo fuzz` passes); no nightly, no
# RUSTC_BOOTSTRAP. Inputs libFuzzer finds go to target/fuzz-corpus/<target>
# (not committed; copy the interesting ones into corpus/<target>).
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_EACH="${1:-30}"
shift || true
TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTFLAGS="-Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares \
 --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# --target keeps RUSTFLAGS off build scripts and proc macros.
cargo build --release --locked --target "$TRIPLE" --bins
BIN="target/$TRIPLE/release"

if [ "$#" -gt 0 ]; then
  TARGETS=("$@")
else
  mapfile -t TARGETS < <(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^gpuslice-fuzz$')
fi

failed=()
summary=()
for t in "${TARGETS[@]}"; do
  work="target/fuzz-corpus/$t"
  mkdir -p "$work" "artifacts/$t" "corpus/$t"
  log="target/fuzz-$t.log"
  echo "=== $t: ${SECONDS_EACH} s"
  # -max_len 1 MiB: the HTTP endpoints accept bodies up to 1 MiB.
  if "$BIN/$t" "$work" "corpus/$t" \
      -max_total_time="$SECONDS_EACH" -max_len=1048576 -len_control=100 \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="artifacts/$t/" >"$log" 2>&1; then
    status=ok
  else
    status=CRASH
    failed+=("$t")
    tail -n 40 "$log"
  fi
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  cov="$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)"
  summary+=("$(printf '%-18s %-6s %12s execs  cov %s' "$t" "$status" "${execs:-?}" "${cov:-?}")")
done

echo "=== fuzz summary (${SECONDS_EACH} s each)"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz/run.sh: crash in: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
